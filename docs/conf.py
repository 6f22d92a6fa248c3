"""Sphinx configuration of the documentation site (Furo theme, MyST Markdown). Built by `make docs`, strictly
(warnings are errors), as part of `make test`: `python -m sphinx -E -W --keep-going -b html docs var/docs-html`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

project = "Agent planner"
author = "The agent-planner developers"
copyright = "the agent-planner developers"  # noqa: A001 (Sphinx's own name)

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "var", "**/.*"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = "Agent planner"
html_static_path: list[str] = []

DOCS = Path(__file__).resolve().parent
GUIDES_MARKER = "<!-- guides: every page of docs/ no other toctree lists -->"


def guides(app: Any, docname: str, source: list[str]) -> None:
    """The index's "Guides" toctree lists every page of docs/ that no other toctree of the index names (the guides
    to plan checks, operator decisions, security, models, runtime guarantees, mutation testing, charts, and any
    other), so a page added by any branch is in the site and the strict build never says "document isn't included
    in any toctree"; with none, there is no Guides section (a glob matching nothing would be a warning)."""
    if docname != root_doc or GUIDES_MARKER not in source[0]:
        return
    listed = set(re.findall(r"^([\w./-]+)$", source[0], re.M))
    pages = sorted(
        path.stem
        for path in DOCS.glob("*.md")
        if path.stem not in listed and path.stem != root_doc
    )
    block = "```{toctree}\n:caption: Guides\n:maxdepth: 2\n\n" + "\n".join(pages) + "\n```\n" if pages else ""
    source[0] = source[0].replace(GUIDES_MARKER, block)


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", guides)
    return {"parallel_read_safe": True}
