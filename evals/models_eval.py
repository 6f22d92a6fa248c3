"""`make eval`: goals worded as users word them, given to a tool agent, planned, approved and run by the runner against
a real model server, and checked strictly (evals/eval_goals.py, evals/harness.py).

Run by the Makefile (which installs and serves SmolLM2-135M-Instruct with llama-cpp-python on the CPU), or by
hand against any OpenAI-compatible server:

    OPENAI_BASE_URL=http://127.0.0.1:8080/v1 EVAL_MODEL=<name> .venv/bin/python evals/models_eval.py

Two passes on a fresh SQLite database, each goal on a fresh agent and workspace: the model's own (the rules planner
off: every goal is the model's), then the rules planner's alone (no model call; a goal it does not plan is reported
as not planned). Per goal: reached approval, asked or refused honestly, outcome verified, harm, calls, seconds.
Tables are printed and var/eval.json written. EVAL_GOALS=1,5 runs some goals only; EVAL_PASSES=model (or rules)
one pass only; EVAL_CONTEXT sets the model's context size (2048).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from dataclasses import asdict
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
os.environ.setdefault("PLAN_DEADLINE_SECONDS", "90")
# No "format": the server's is found at the first call (agents/llm/structured.py).
os.environ.setdefault("LLM_MODEL_SETTINGS", json.dumps({MODEL: {
    "context": int(os.environ.get("EVAL_CONTEXT", "2048")), "small": True}}))
os.environ["PLAN_ONE_STEP_SHORTCUT"] = "all"  # the rules pass: every goal the rules can plan; off per agent otherwise

import django  # noqa: E402

django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.core.management import call_command  # noqa: E402

from evals.eval_goals import GOALS  # noqa: E402
from evals.harness import run_goal, summary, table  # noqa: E402


def server_drain() -> None:
    """Wait until the server has finished what an earlier goal left it doing (a request the planner gave up on
    still runs to its max_tokens on a one-at-a-time server), so that each goal starts on an idle server."""
    import httpx

    base = os.environ.get("OPENAI_BASE_URL", "").rstrip("/")
    if not base:
        return
    body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "ok"}]}
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(f"{base}/chat/completions", json=body, timeout=300,
                   headers={"Authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', 'none')}"})


def main() -> int:
    call_command("migrate", verbosity=0, interactive=False)
    user = User.objects.create_user("eval", is_staff=True)
    chosen = {int(n) for n in os.environ.get("EVAL_GOALS", "").split(",") if n.strip()}
    goals = [(i, goal) for i, goal in enumerate(GOALS, start=1) if not chosen or i in chosen]
    passes = [p.strip() for p in os.environ.get("EVAL_PASSES", "model,rules").split(",") if p.strip()]
    result: dict[str, object] = {"model": MODEL, "base_url": os.environ.get("OPENAI_BASE_URL", "")}
    out = ROOT / "var" / os.environ.get("EVAL_OUT", "eval.json")
    out.parent.mkdir(exist_ok=True)
    for name in passes:
        rows = []
        for i, goal in goals:
            if name == "model":
                server_drain()
            rows.append(run_goal(goal, user, i, rules=name == "rules"))
            print(f"{name} {i}: {table(rows[-1:]).splitlines()[-1]}", flush=True)
            # Written as it goes: an interrupted run keeps the goals it finished.
            result[name] = {"summary": summary(rows), "goals": [asdict(r) for r in rows]}
            out.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
        title = (f"the model {MODEL} (rules planner off)" if name == "model"
                 else "the rules planner alone (no model call)")
        print(f"\n{title}\n{table(rows)}")
        print(json.dumps(summary(rows)))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
