"""Imports point down: settings, the domain, the LLM layer, the runtime and the pages each import only what is
below them. Read from the source (every import, also those inside functions), so a new upward import fails here
before it becomes a ring.

    pages, API, consumers, admin, management commands   (top)
    runtime: agents/runtime (cycles as jobs, the embedded scheduler)
    domain services and selectors: agents, goals, planning
    LLM layer: agents/llm (the fallback chain, structured output, the OpenAI-compatible provider): no app code
    models
    settings                                               (bottom: no app code at all)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APPS = ("agents", "goals", "planning", "planner_site", "policies", "notifications")


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


def sources(*globs: str) -> list[Path]:
    found = {p for g in globs for p in ROOT.glob(g) if "migrations" not in p.parts}
    return sorted(found)


def offending(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{line} imports {module}" for p in paths for line, module in imports_of(p)
            if any(module == f or module.startswith(f + ".") for f in forbidden)]


def test_settings_import_no_app_code() -> None:
    app_modules = tuple(a for a in APPS if a != "planner_site") + ("planner_site.events", "planner_site.statements")
    assert offending([ROOT / "planner_site" / "settings.py"], app_modules) == []


def test_models_import_no_services_runtime_or_pages() -> None:
    upper = ("agents.runtime", "agents.services", "agents.cycle", "planning.services", "planning.planner",
             "planning.views", "planning.api", "planning.live", "goals.services")
    assert offending(sources("*/models.py"), upper) == []


def test_only_the_top_imports_the_runtime() -> None:
    """The runtime drives the domain; the domain never reaches up into it (management commands, the health
    page and the ASGI app start or report it)."""
    below = [p for p in sources("agents/**/*.py", "goals/**/*.py", "planning/**/*.py", "planner_site/**/*.py")
             if "runtime" not in p.parts and "management" not in p.parts
             and p.relative_to(ROOT).as_posix() not in {"planner_site/health.py", "planner_site/asgi.py"}]
    assert offending(below, ("agents.runtime",)) == []


def test_the_domain_imports_no_pages_or_consumers() -> None:
    """Services, selectors and the engine never import a view, the API, a consumer or the admin."""
    domain = sources("agents/services.py", "agents/selectors.py", "agents/cycle.py", "agents/tools.py", "agents/world.py",
                     "goals/services.py", "goals/selectors.py", "goals/system.py", "planning/services/*.py",
                     "planning/*selectors.py", "planning/planner.py", "planning/engine/*.py")
    pages = ("planning.views", "planning.views_audit", "planning.views_editor", "planning.views_inbox", "planning.api",
             "planning.api_ws", "planning.live", "planning.steer_consumers", "agents.admin", "planning.admin",
             "goals.admin")
    assert offending(domain, pages) == []


def test_live_page_renderers_import_no_hub_and_no_socket() -> None:
    """What a live page shows is rendered without knowing who listens: no hub, no consumer, no channels."""
    renderers = [ROOT / "planning" / "live" / "renderers.py"]
    assert offending(renderers, ("planning.live.hub", "planning.live.consumers", "planning.steer_consumers",
                                 "planning.api_ws", "channels")) == []


def test_the_live_hub_imports_no_consumer() -> None:
    """The hub serves any client that can be pushed to and closed; the consumers join it, never the reverse."""
    hub = [ROOT / "planning" / "live" / "hub.py"]
    assert offending(hub, ("planning.live.consumers", "planning.steer_consumers", "planning.api_ws",
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
    named = ("agents.models", "agents.tools", "agents.world", "agents.services", "agents.cycle", "agents.runtime",
             "agents.offline_model", "planning", "goals", "policies", "notifications")
    assert all(outside_the_llm_layer(module) for module in named)
