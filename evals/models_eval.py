"""`make eval`: everyday goals through the real planner against a real model server.

Run by the Makefile (which installs and serves SmolLM2-135M-Instruct with llama-cpp-python on the CPU), or by
hand against any OpenAI-compatible server:

    OPENAI_BASE_URL=http://127.0.0.1:8080/v1 EVAL_MODEL=<name> .venv/bin/python evals/models_eval.py

Each goal is planned on a fresh SQLite database and workspace. Per goal: valid at the first call, valid at
all, correct (the plan approved and executed with the real tools produced the expected files and changed
no input), model calls, seconds, finish reasons. A table is printed and var/eval.json written.
EVAL_SHORTCUT=0 turns the one-step shortcut off (PLAN_ONE_STEP_SHORTCUT=off), so that every goal is the model's.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TMP = Path(tempfile.mkdtemp(prefix="planner-eval-"))
MODEL = os.environ.get("EVAL_MODEL", "smollm2-135m")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "planner_site.settings")
os.environ.pop("DATABASE_URL", None)
os.environ["SQLITE_PATH"] = str(TMP / "eval.sqlite3")
os.environ["AGENT_WORKSPACES"] = str(TMP / "workspaces")
os.environ["RUNNER_AUTOSTART"] = "0"
os.environ.setdefault("PLANNER_MODELS", MODEL)
os.environ.setdefault("FAST_MODELS", MODEL)
os.environ.setdefault("PLAN_DEADLINE_SECONDS", "30")
os.environ.setdefault("LLM_MODEL_SETTINGS", json.dumps({MODEL: {
    "format": os.environ.get("EVAL_FORMAT", "json_object"), "context": int(os.environ.get("EVAL_CONTEXT", "2048")),
    "small": True}}))
os.environ["PLAN_ONE_STEP_SHORTCUT"] = "small" if os.environ.get("EVAL_SHORTCUT", "1") == "1" else "off"

import django  # noqa: E402

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402

from agents.models import Agent, LLMCall  # noqa: E402
from agents.tools import tool_run  # noqa: E402
from planning import services  # noqa: E402
from planning.models import Plan  # noqa: E402
from planning.planner import plan_generate  # noqa: E402

FILES = {
    "data.csv": "name,qty\napple,3\npear,5\nplum,7\n",
    "people.json": '[{"name": "Ada", "age": 36}, {"name": "Alan", "age": 41}]',
    "notes.txt": "Buy milk. Call the bank. The meeting moved to Friday.\n",
    "log.txt": "started\n",
}


def has(path: str, check: Callable[[str], bool] = lambda _text: True) -> Callable[[Path], bool]:
    return lambda ws: (ws / path).is_file() and check((ws / path).read_text(encoding="utf-8"))


@dataclass
class Goal:
    text: str
    expect: list[Callable[[Path], bool]]
    changes: tuple[str, ...] = ()  # inputs the goal asks to change


GOALS = [
    Goal("Convert data.csv to JSON", [has("data.json", lambda t: '"apple"' in t)]),
    Goal("Count the rows in data.csv and write the count to count.txt", [has("count.txt", lambda t: "3" in t)]),
    Goal("List the workspace", []),
    Goal("Copy notes.txt to backup/notes.txt", [has("backup/notes.txt", lambda t: "milk" in t)]),
    Goal("Convert people.json to CSV as people.csv", [has("people.csv", lambda t: "Ada" in t)]),
    Goal("Count the words in notes.txt and save the count to words.txt", [has("words.txt")]),
    Goal("Write hello world to hello.txt", [has("hello.txt", lambda t: "hello" in t.lower())]),
    Goal("Append the line done to log.txt", [has("log.txt", lambda t: "done" in t)], changes=("log.txt",)),
    Goal("Create a folder named archive", [lambda ws: (ws / "archive").is_dir()]),
    Goal("Write a report about notes.txt to report.md", [has("report.md")]),
]


@dataclass
class Row:
    goal: str
    valid_first: bool = False
    valid: bool = False
    correct: bool = False
    calls: int = 0
    seconds: float = 0.0
    finish_reasons: list[str] = field(default_factory=list)
    status: str = ""
    why: str = ""
    steps: list[str] = field(default_factory=list)


def execute(plan: Plan, ws: Path) -> str:
    """Run the plan's steps in order with the real tools; the first error, or ""."""
    for step in plan.steps.order_by("position"):
        if not step.tool:
            continue
        try:
            tool_run(step.tool, step.tool_input, workspace=ws, loop=step.loop or None)
        except Exception as exc:  # noqa: BLE001 - any failure is this goal's result
            return f"step {step.key} ({step.tool}): {exc}"
    return ""


def server_drain() -> None:
    """Wait until the server has finished whatever an earlier goal left it doing (a request the planner gave
    up on still runs to its max_tokens on a one-at-a-time server), so each goal starts on an idle server."""
    import httpx

    base = os.environ.get("OPENAI_BASE_URL", "").rstrip("/")
    if not base:
        return
    from planning.engine.prompts import COMPACT_TOOL_RULES, COMPACT_TOOL_SYSTEM

    # The compact prompt's opening, so the server's prompt cache keeps it for the goal's first call.
    body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "system", "content": COMPACT_TOOL_SYSTEM},
                                                          {"role": "user", "content": COMPACT_TOOL_RULES}]}
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(f"{base}/chat/completions", json=body, timeout=300,
                   headers={"Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', 'none')}"})


def run_goal(goal: Goal, user: User, index: int) -> Row:
    server_drain()
    agent = Agent.objects.create(name=f"Eval {index}", kind=Agent.Kind.TOOL)
    ws = agent.workspace
    ws.mkdir(parents=True, exist_ok=True)
    for name, text in FILES.items():
        (ws / name).write_text(text, encoding="utf-8")
    started = time.monotonic()
    plan = plan_generate(agent=agent, goal_text=goal.text, actor_label="eval")
    row = Row(goal=goal.text, seconds=round(time.monotonic() - started, 1), status=plan.status)
    calls = list(LLMCall.objects.filter(plan=plan).order_by("created_at", "pk"))
    row.calls = len(calls)
    row.finish_reasons = [c.finish_reason or ("error" if c.error else "?") for c in calls]
    row.valid = plan.status == Plan.Status.AWAITING_APPROVAL
    row.steps = [f"{s.tool} {json.dumps(s.tool_input)}" for s in plan.steps.order_by("position")]
    plan_calls = [c for c in calls if c.purpose in ("plan", "replan")]
    rejected = plan.events.filter(kind="attempt_rejected").count()
    row.valid_first = row.valid and rejected == 0 and len(plan_calls) <= 1
    if not row.valid:
        row.why = plan.failure_reason.split("\n")[0][:150] if plan.failure_reason else plan.status
        reasons = [r for e in plan.events.filter(kind="attempt_rejected") for r in e.detail.get("reasons", [])]
        if reasons:
            row.why += " | " + "; ".join(dict.fromkeys(reasons))[:300]
        return row
    services.plan_approve(plan=plan, user=user, mode=Plan.ApprovalMode.ALL)
    before = {name: (ws / name).read_text(encoding="utf-8") for name in FILES if name not in goal.changes}
    error = execute(plan, ws)
    changed = [name for name, text in before.items()
               if not (ws / name).is_file() or (ws / name).read_text(encoding="utf-8") != text]
    missing = [i for i, check in enumerate(goal.expect) if not check(ws)]
    row.correct = not error and not changed and not missing
    row.why = error or (f"changed input {', '.join(changed)}" if changed else "") or (
        f"expected result {missing} missing" if missing else "")
    return row


def main() -> int:
    call_command("migrate", verbosity=0, interactive=False)
    user = User.objects.create_user("eval", is_staff=True)
    chosen = {int(n) for n in os.environ.get("EVAL_GOALS", "").split(",") if n.strip()}  # e.g. "7,8"
    rows = [run_goal(goal, user, i) for i, goal in enumerate(GOALS, start=1) if not chosen or i in chosen]
    print(f"\nmodel {MODEL} at {os.environ.get('OPENAI_BASE_URL')} shortcut={os.environ['PLAN_ONE_STEP_SHORTCUT']}")
    print(f"{'goal':62} {'1st':>4} {'valid':>5} {'right':>5} {'calls':>5} {'s':>6}  finish / why")
    for r in rows:
        print(f"{r.goal[:62]:62} {'yes' if r.valid_first else 'no':>4} {'yes' if r.valid else 'no':>5} "
              f"{'yes' if r.correct else 'no':>5} {r.calls:>5} {r.seconds:>6.1f}  {','.join(r.finish_reasons)} {r.why}")
    summary = {
        "model": MODEL, "base_url": os.environ.get("OPENAI_BASE_URL", ""),
        "shortcut": os.environ["PLAN_ONE_STEP_SHORTCUT"] != "off",
        "valid_first": sum(r.valid_first for r in rows), "valid": sum(r.valid for r in rows),
        "valid_within_30s": sum(r.valid and r.seconds <= 30 for r in rows),
        "correct": sum(r.correct for r in rows), "goals": len(rows),
        "median_calls": statistics.median(r.calls for r in rows),
        "max_seconds": max(r.seconds for r in rows),
    }
    print(json.dumps(summary))
    out = ROOT / "var" / os.environ.get("EVAL_OUT", "eval.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "goals": [asdict(r) for r in rows]}, indent=2), encoding="utf-8")
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
