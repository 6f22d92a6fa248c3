"""docs/settings.md is the one table of every setting: each environment variable the settings (and the API's own
in planning/api.py) read is a row of it, so a new setting cannot ship without its default and what it does; and
no other page keeps a table of settings of its own (it links to its section of docs/settings.md instead)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READERS = ("planner_site/settings.py", "planning/api.py")
DOC = ROOT / "docs" / "settings.md"


def environment_reads(path: Path) -> tuple[set[str], list[int]]:
    """The names the module reads from the environment (`os.environ.get`, `os.environ[...]`, `os.getenv`, and its
    helpers named `env_*`), and the lines where a name is not written out (a name built at run time cannot be
    checked against the page, so it fails the test too). The helpers' own bodies read the name they are given."""
    tree = ast.parse(path.read_text(), str(path))
    helpers = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name.startswith("env")}
    inside_helpers = {id(child) for node in ast.walk(tree)
                      if isinstance(node, ast.FunctionDef) and node.name in helpers for child in ast.walk(node)}
    names: set[str] = set()
    unnamed: list[int] = []

    def environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            reads = ((isinstance(func, ast.Attribute) and func.attr == "get" and environ(func.value))
                     or (isinstance(func, ast.Attribute) and func.attr == "getenv")
                     or (isinstance(func, ast.Name) and func.id in helpers))
            argument = node.args[0] if reads and node.args else None
        elif isinstance(node, ast.Subscript) and environ(node.value) and isinstance(node.ctx, ast.Load):
            reads, argument = True, node.slice
        else:
            continue
        if not reads or id(node) in inside_helpers:
            continue
        if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
            names.add(argument.value)
        else:
            unnamed.append(node.lineno)
    return names, unnamed


NAME = r"`([A-Z][A-Z0-9_]*)`"
NAMES_CELL = re.compile(rf"\s*{NAME}(\s*,\s*{NAME})*\s*")


def row_names(text: str) -> set[str]:
    """The settings a page's table rows are about: the names of a row whose first cell is one or more upper-case
    names and nothing else (`| `LLM_TIMEOUT_SECONDS` | ...`, not `| scale-out (`REDIS_URL`) | ...`)."""
    return {name for line in text.splitlines() if line.startswith("|")
            if NAMES_CELL.fullmatch(cell := line.strip("|").split("|")[0])
            for name in re.findall(NAME, cell)}


def test_every_environment_variable_read_is_in_the_settings_table() -> None:
    rows = {name for line in DOC.read_text().splitlines() if line.startswith("| `")  # a row's first cell names it
            for name in re.findall(NAME, line.split(" | ")[0])}
    missing, unnamed = [], []
    for reader in READERS:
        names, lines = environment_reads(ROOT / reader)
        assert names, f"{reader}: no environment read found; has the way settings are read changed?"
        missing += [f"{reader}: {name}" for name in sorted(names - rows)]
        unnamed += [f"{reader}:{line}" for line in lines]
    assert not missing, "docs/settings.md lists no row for:\n" + "\n".join(missing)
    assert not unnamed, "environment variables read by a name built at run time (write the name out):\n" + "\n".join(
        unnamed)


def test_no_other_page_keeps_a_settings_table() -> None:
    settings = row_names(DOC.read_text())
    assert len(settings) > 100, "docs/settings.md's rows are no longer read; has the table's form changed?"
    tables = {f"{page.name}: {', '.join(sorted(names))}" for page in sorted(DOC.parent.glob("*.md")) if page != DOC
              if (names := row_names(page.read_text()) & settings)}
    assert not tables, ("these pages keep a table of settings beside docs/settings.md; move what they say there and "
                        "link to its section:\n" + "\n".join(sorted(tables)))
