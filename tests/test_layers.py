"""Imports point down: settings, the domain, the LLM layer, the runtime and the pages each import only what is
below them. Read from the source of every app (every import, also those inside functions and under
TYPE_CHECKING), so a new upward import fails here before it becomes a ring.

    5 pages, API, MCP, consumers, admin, forms, template tags, URLs, ASGI, management commands   (top)
    4 runtime: the runtime app (a cycle's orchestration, cycles as jobs, the embedded scheduler, the
      notifications' dispatch and jobs, retention)
    3 domain: services, selectors, the planner, the persona and goal rules of every app
    2 models
    1 pure code: the LLM layer (agents/llm, agents/connections), the plan engine (planning/engine), the tool
      specs (agents/tools), outbound HTTP and tracing of planner_site: no model, no app code above them
    0 settings (and the pool check they name)                   (bottom: no app code at all)

The domain tells a layer above what happened through signals, which that layer connects in its AppConfig.ready;
it never imports it: agents/signals.py, which the runtime connects, and planning/signals.py (a plan or steps now
wait for approval, sent in the transaction), which the policies connect. Services of one app call another app's
services only through the interfaces named in SERVICES_INTERFACES below, each with its reason.

No import closes a ring: the imports that run (at module level and inside functions, not under TYPE_CHECKING)
make no cycle among the project's modules, so no import inside a function hides one, and no module silences
ruff's lazy-import rule (PLC0415) to keep one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APPS = ("agents", "goals", "planning", "planner_site", "policies", "notifications", "runtime")

TOP_PARTS = frozenset({
    "accounts", "admin", "admin_audit", "api", "api_ws", "apps", "asgi", "asgi_guards", "consumers", "error_pages",
    "forms", "health", "live", "management", "mcp_server", "mcp_tasks", "routing", "templatetags", "urls",
    "views", "views_audit", "views_editor", "views_inbox", "views_slack", "views_confirm", "forms_slack", "views_a2a",
})
RUNTIME = ("runtime",)
PURE = ("agents.llm", "agents.connections", "agents.tools", "planning.engine", "planner_site.outbound",
        "planner_site.tracing")
SETTINGS = ("planner_site.settings", "planner_site.db_pool")
LAYER_NAMES = ("settings", "pure code", "models", "domain", "runtime", "top")

# Upward imports that stay, each with its reason: (importing module, imported module) -> why.
UPWARD_ALLOWED: dict[tuple[str, str], str] = {
    ("planning.engine.validate", "planning.models"):
        "under TYPE_CHECKING only: StepSpec.from_step's annotation names PlanStep; the engine never queries",
}

# Services of one app that call another app's services: (importing module, imported module) -> the named
# interface and why. Nothing else of one app's services reaches into another's.
SERVICES_INTERFACES: dict[tuple[str, str], str] = {
    ("goals.services", "agents.services"):
        "rows_write: the one bulk write of checked, locked rows (bulk_create with update_conflicts)",
    ("goals.services", "planning.services.plans"):
        "goals_open_plans_locked, goals_plans_closed: a goal a milestone completes closes its open plans",
    ("planning.services.cycles", "agents.services"):
        "the agents' own rows of a persona pass (agents_cycled, needs_move, goals_write, lessons_learn, "
        "cycle_next_at), change_of and rows_write",
    ("planning.services.steps", "agents.services"):
        "rows_write: the one bulk write of checked, locked rows (bulk_create with update_conflicts)",
    ("planning.services.versions", "agents.services"):
        "rows_write: the one bulk write of checked, locked rows (bulk_create with update_conflicts)",
    ("policies.services", "planning.services"):
        "a policy's decision is the operator's decision through the same services (step_approve, plan_approve, "
        "...); the planning services tell the policies an item waits through planning/signals.py, never by import",
}


def imports_of(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in the file, relative ones resolved."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            yield node.lineno, module
            for alias in node.names:  # `from planner_site import statements` names a module too
                yield node.lineno, f"{module}.{alias.name}"


def type_checking(test: ast.expr) -> bool:
    """The test of `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`), whose body never runs."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def running_imports(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line, module, inside a function) for every import of the file that runs: not those under TYPE_CHECKING."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])

    def walk(nodes: list[ast.stmt], in_function: bool) -> Iterator[tuple[int, str, bool]]:
        for node in nodes:
            if isinstance(node, ast.If) and type_checking(node.test):
                yield from walk(node.orelse, in_function)
                continue
            if isinstance(node, ast.Import):
                yield from ((node.lineno, alias.name, in_function) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join([*base, module] if module else base)
                yield node.lineno, module, in_function
                yield from ((node.lineno, f"{module}.{alias.name}", in_function) for alias in node.names)
            inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                yield from walk([n for n in getattr(node, field, []) if isinstance(n, ast.stmt | ast.excepthandler
                                                                                   | ast.match_case)], inner)

    yield from walk(ast.parse(path.read_text(), str(path)).body, False)


def imported_modules(module: str, imported: str) -> Iterator[str]:
    """The project's modules an import of `imported` by `module` runs: the module and the packages above it
    (their __init__ runs first), but not a package `module` is itself inside (it is being imported already)."""
    parts = imported.split(".")
    for end in range(len(parts), 1, -1):
        name = ".".join(parts[:end])
        inside = module.startswith(name + ".")
        if is_module(name) and name != module and not (end < len(parts) and inside):
            yield name


def import_graph() -> tuple[dict[str, set[str]], list[tuple[str, int, str, str]]]:
    """The project's modules and those each imports when it runs; and each import made inside a function:
    (file, line, module, imported module)."""
    graph: dict[str, set[str]] = {}
    in_functions: list[tuple[str, int, str, str]] = []
    for path in app_sources():
        module = module_of(path)
        for line, name, in_function in running_imports(path):
            for imported in imported_modules(module, name):
                graph.setdefault(module, set()).add(imported)
                if in_function:
                    in_functions.append((path.relative_to(ROOT).as_posix(), line, module, imported))
    return graph, list(dict.fromkeys(in_functions))  # `from a.b import c` names a.b twice


def import_path(graph: dict[str, set[str]], start: str, end: str) -> list[str] | None:
    """The shortest chain of imports from `start` to `end`, or None when `start` never imports `end`."""
    came_from: dict[str, str | None] = {start: None}
    todo = [start]
    while todo:
        current = todo.pop(0)
        if current == end:
            chain = [current]
            while (before := came_from[chain[-1]]) is not None:
                chain.append(before)
            return chain[::-1]
        for imported in sorted(graph.get(current, ())):
            if imported not in came_from:
                came_from[imported] = current
                todo.append(imported)
    return None


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """A module of the project's own (not a package's name alone, nor a function imported from a module)."""
    path = ROOT.joinpath(*name.split("."))
    return name.split(".")[0] in APPS and "." in name and (path.with_suffix(".py").exists()
                                                         or (path / "__init__.py").exists())


def under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def layer(module: str) -> int:
    """The layer of one of the project's modules, 0 (settings) to 5 (the top); see the opening docstring."""
    if under(module, SETTINGS):
        return 0
    if under(module, PURE):
        return 1
    parts = module.split(".")
    if "models" in parts or parts[-1].endswith("_models"):  # agents/agui_models.py: models of their own module
        return 2
    if any(part in TOP_PARTS for part in parts[1:]):
        return 5
    return 4 if under(module, RUNTIME) else 3


def app_sources() -> list[Path]:
    return sources(*(f"{app}/**/*.py" for app in APPS))


def sources(*globs: str) -> list[Path]:
    found = {p for g in globs for p in ROOT.glob(g) if "migrations" not in p.parts}
    return sorted(found)


def offending(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{line} imports {module}" for p in paths for line, module in imports_of(p)
            if any(module == f or module.startswith(f + ".") for f in forbidden)]


def test_every_app_is_scanned() -> None:
    """A new top-level app is scanned too: every package beside manage.py but the tests is in APPS."""
    # evals/ is the `make eval` harness beside the product (it drives the runner as a user would), not an app.
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "evals"}
    assert packages == set(APPS)


def test_no_module_imports_a_higher_layer() -> None:
    """Every import of every app, at module level or inside a function, points down or sideways."""
    found = []
    for path in app_sources():
        module = module_of(path)
        for line, imported in imports_of(path):
            if (is_module(imported) and layer(imported) > layer(module)
                    and (module, imported) not in UPWARD_ALLOWED):
                found.append(f"{path.relative_to(ROOT)}:{line} ({LAYER_NAMES[layer(module)]}) imports {imported} "
                             f"({LAYER_NAMES[layer(imported)]})")
    assert found == []


def test_services_reach_other_apps_services_only_through_named_interfaces() -> None:
    found = []
    for path in app_sources():
        module = module_of(path)
        if "services" not in module.split("."):
            continue
        for line, imported in imports_of(path):
            parts = imported.split(".")
            if (is_module(imported) and "services" in parts and parts[0] != module.split(".")[0]
                    and (module, imported) not in SERVICES_INTERFACES):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    assert found == []


def test_the_allowed_exceptions_still_exist() -> None:
    """An exception that is no longer needed leaves the lists (so they say what is true)."""
    seen = {(module_of(path), imported) for path in app_sources() for _, imported in imports_of(path)}
    assert set(UPWARD_ALLOWED) - seen == set()
    assert set(SERVICES_INTERFACES) - seen == set()


def test_no_import_inside_a_function_hides_a_cycle() -> None:
    """An import moved into a function to dodge a ring (A imports B at module level, B imports A when called) is
    refused: the ring is broken instead, by a signal (planning/signals.py), a module above both, or a caller that
    passes what is needed. An import inside a function that is not part of a ring (a heavy package loaded on
    first use, the AppConfig's ready) stays."""
    graph, in_functions = import_graph()
    found = [f"{path}:{line} {module} imports {imported} inside a function; back: "
             f"{' -> '.join(import_path(graph, imported, module) or [])}"
             for path, line, module, imported in in_functions if import_path(graph, imported, module)]
    assert found == []


def test_the_project_imports_without_a_ring() -> None:
    """No cycle among the project's modules at all, at module level either: the layers and the signals keep
    every import pointing one way."""
    graph, _ = import_graph()
    found = [f"{module} -> {' -> '.join(chain)}" for module in sorted(graph) for imported in sorted(graph[module])
             if (chain := import_path(graph, imported, module))]
    assert found == []


def test_no_module_silences_the_lazy_import_rule() -> None:
    """`noqa: PLC0415` (ruff's import-outside-top-level) marked an import kept inside a function to hide a ring;
    none is left, and none comes back."""
    found = [f"{path.relative_to(ROOT)}:{number}" for path in app_sources()
             for number, text in enumerate(path.read_text().splitlines(), 1) if "PLC0415" in text]
    assert found == []


def test_the_import_graph_sees_imports_inside_functions() -> None:
    """The graph the two tests above read: an import inside a function is an edge of it, marked so; one under
    TYPE_CHECKING is not (it never runs)."""
    graph, in_functions = import_graph()
    assert "policies.services" in graph["policies.apps"]
    assert ("policies.apps", "planning.signals") in {(module, imported) for _, _, module, imported in in_functions}
    assert "planning.models" not in graph.get("planning.engine.validate", set())
    assert import_path(graph, "policies.services", "planning.services.steps") == [
        "policies.services", "planning.services", "planning.services.steps"]
    assert import_path(graph, "planning.services.steps", "policies.services") is None


def test_the_layers_are_told_apart() -> None:
    """The classification itself: a page, a runtime module, a service, a model, the engine and the settings."""
    assert [layer(m) for m in ("planning.views", "runtime.notify", "runtime.cycles",
                               "planning.services.steps", "policies.models", "planning.engine.validate",
                               "agents.llm.gateway", "planner_site.settings")] == [5, 4, 4, 3, 2, 1, 1, 0]


def test_settings_import_no_app_code() -> None:
    app_modules = tuple(a for a in APPS if a != "planner_site") + ("planner_site.events", "planner_site.statements")
    assert offending([ROOT / "planner_site" / "settings.py"], app_modules) == []


def test_models_import_no_services_runtime_or_pages() -> None:
    upper = ("runtime", "agents.services", "planning.services", "planning.planner",
             "planning.views", "planning.api", "planning.live", "goals.services")
    assert offending(sources("*/models.py"), upper) == []


def test_only_the_top_imports_the_runtime() -> None:
    """The runtime drives the domain; the domain never reaches up into it (management commands, the health
    page and the ASGI app start or report it)."""
    below = [p for p in sources("agents/**/*.py", "goals/**/*.py", "planning/**/*.py", "planner_site/**/*.py",
                                "policies/**/*.py", "notifications/**/*.py")
             if "management" not in p.parts
             and p.relative_to(ROOT).as_posix() not in {"planner_site/health.py", "planner_site/asgi.py"}]
    assert offending(below, ("runtime",)) == []


def test_the_domain_imports_no_pages_or_consumers() -> None:
    """Services, selectors and the engine never import a view, the API, a consumer or the admin."""
    domain = sources("agents/services.py", "agents/selectors.py", "runtime/cycle.py", "agents/tools.py", "agents/world.py",
                     "goals/services.py", "goals/selectors.py", "goals/system.py", "planning/services/*.py",
                     "planning/*selectors.py", "planning/planner.py", "planning/engine/*.py")
    pages = ("planning.views", "planning.views_audit", "planning.views_editor", "planning.views_inbox", "planning.api",
             "planning.api_ws", "planning.live", "planning.live.operator_consumers", "agents.admin", "planning.admin",
             "goals.admin")
    assert offending(domain, pages) == []


def test_live_page_renderers_import_no_hub_and_no_socket() -> None:
    """What a live page shows is rendered without knowing who listens: no hub, no consumer, no channels."""
    renderers = [ROOT / "planning" / "live" / "renderers.py"]
    assert offending(renderers, ("planning.live.hub", "planning.live.consumers", "planning.live.operator_consumers",
                                 "planning.api_ws", "channels")) == []


def test_the_live_hub_imports_no_consumer() -> None:
    """The hub serves any client that can be pushed to and closed; the consumers join it, never the reverse."""
    hub = [ROOT / "planning" / "live" / "hub.py"]
    assert offending(hub, ("planning.live.consumers", "planning.live.operator_consumers", "planning.api_ws",
                           "planning.routing", "channels.generic")) == []


# Of the project's own code the LLM layer may import only itself and agents.connections (which imports no model).
LLM_LAYER_MAY_IMPORT = ("agents.llm", "agents.connections")


def outside_the_llm_layer(module: str) -> bool:
    own = module.split(".")[0] in APPS
    return own and not any(module == m or module.startswith(m + ".") for m in LLM_LAYER_MAY_IMPORT)


@pytest.mark.parametrize("path", sources("agents/llm/*.py"), ids=lambda p: p.name)
def test_the_llm_layer_imports_no_runtime_and_no_planning(path: Path) -> None:
    """The LLM layer imports neither the domain nor the runtime: providers are registered from settings
    (LLM_PROVIDERS; the offline model lives with the world it simulates, agents/offline_model.py), calls are
    recorded through LLM_CALL_RECORDER, and a plan's schema is given the tools' specs by its caller. So no
    model, tool, world, service, cycle or runtime of agents, and nothing of planning, goals, policies,
    notifications or the site."""
    found = [f"{path.relative_to(ROOT)}:{line} imports {module}" for line, module in imports_of(path)
             if outside_the_llm_layer(module)]
    assert found == []
    named = ("agents.models", "agents.tools", "agents.world", "agents.services", "runtime.cycle", "runtime",
             "agents.offline_model", "planning", "goals", "policies", "notifications")
    assert all(outside_the_llm_layer(module) for module in named)
