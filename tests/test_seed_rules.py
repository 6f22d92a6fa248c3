"""Seed rules that cut across the apps (docs/seeds.md cites each test here with its rule)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agents.offline_model import offline_complete
from agents.tools import TOOLS, workspace_listing
from planning.engine.parse import plan_parse
from planning.engine.prompts import prompt_plan

ROOT = Path(__file__).resolve().parents[1]
MODEL_CALLERS = ("agents.llm.gateway", "agents.offline_model", "agents.llm.openai_provider", "openai", "httpx")


def test_the_planning_engine_builds_prompts_and_parses_but_never_reaches_a_model() -> None:
    """Seed 004: the engine never calls a model. Importing every engine module, alone in a fresh interpreter,
    loads no model client, no gateway and no database layer."""
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import planning.engine as engine\n"
        "for m in pkgutil.iter_modules(engine.__path__): importlib.import_module('planning.engine.' + m.name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                       check=True).stdout)
    assert "planning.engine.prompts" in loaded and "planning.engine.parse" in loaded
    reached = [m for m in loaded if m.startswith((*MODEL_CALLERS, "django.db"))]
    assert reached == []


def offline_plan_tools(goal: str, workspace: Path) -> list[str]:
    messages = prompt_plan(kind="tool", goal=goal, restatement=None, agent_name="Acta", backstory="",
                           tools=list(TOOLS.values()), allowed_actions=(), needs={}, rejection_reasons=(),
                           last_rejected_output="", feedback=(), retry_hints=(), max_steps=20,
                           workspace_files=workspace_listing(workspace))
    rules = messages[-1]["content"]
    assert "read-only steps come first" in rules
    assert "add a file.read step that checks the result (verification)" in rules
    return [step["tool"] for step in plan_parse(offline_complete("plan", messages)).data["steps"]]


def test_the_offline_planner_reads_first_and_verifies_what_it_wrote(tmp_path: Path) -> None:
    """Seed 003's strategies, read-only first and verification steps: the prompt asks for both; the offline
    model's plans on existing files start by reading them, and a converted, counted or written file is read back."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "monday.txt").write_text("Met the team. Planned the week.")
    (tmp_path / "data.csv").write_text("a,b\n1,2\n3,4\n")
    for goal in ("Summarize the notes folder into report.md", "Convert data.csv to JSON",
                 "Count the rows of data.csv into count.txt", "Sort the notes folder by extension"):
        tools = offline_plan_tools(goal, tmp_path)
        assert not TOOLS[tools[0]].risky, (goal, tools)  # it starts by reading
    for goal in ("Convert data.csv to JSON", "Count the rows of data.csv into count.txt",
                 'Write a note called shopping.txt saying "milk, bread"'):
        tools = offline_plan_tools(goal, tmp_path)
        assert TOOLS[tools[-2]].risky and tools[-1] == "file.read", (goal, tools)  # then checks what it wrote
