"""An example external agent: plans file work with any OpenAI-compatible model, steered from the dashboard.

It works in one local folder with three tools: `list_files` and `read_file` (safe) and `write_file` (risky,
so the dashboard asks an operator before it runs). The model writes the plan; the dashboard validates it
against the declared tools (problems go back to the model), an operator approves it, and each write waits
for the operator's approval. When the operator declines a step with feedback, the model replans with that
feedback and the agent submits version 2, which keeps the steps already done.

    pip install openai ./clients/python
    export PLANNER_URL=http://127.0.0.1:8000 PLANNER_TOKEN=$(manage.py agent_token "Notes agent" | tail -1)
    export OPENAI_BASE_URL=http://localhost:11434/v1 MODEL=qwen2.5:7b-instruct   # any OpenAI-compatible server
    python examples/notes_agent.py --workdir ./notes "Summarize meeting.txt into summary.txt"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from openai import OpenAI
from planner_client import Client, PlanCancelled, PlanFailed, PlanInvalid, ReplanNeeded, Step

TOOLS: list[dict[str, Any]] = [
    {"name": "list_files", "description": "List the files of the work folder", "risk": "safe",
     "input_schema": {"type": "object", "properties": {}}},
    {"name": "read_file", "description": "Read a text file of the work folder", "risk": "safe",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "write_file", "description": "Create or overwrite a text file of the work folder", "risk": "risky",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                      "required": ["path", "content"]}},
]
PLAN_ATTEMPTS = 3

SYSTEM = """You plan file tasks in one work folder. Tools:
{tools}
Answer with JSON only, no prose:
{{"steps": [{{"id": "1", "tool": "<tool>", "intent": "<why, one line>", "input": {{...}},
  "requiresPermission": <true for write_file>, "dependencies": ["<ids of earlier steps>"]}}]}}"""


class ToolFailed(Exception):
    pass


def inside(workdir: Path, name: object) -> Path:
    """A path of the work folder; anything outside it is refused."""
    if not isinstance(name, str) or not name.strip():
        raise ToolFailed("a path is required")
    path = (workdir / name).resolve()
    if not path.is_relative_to(workdir.resolve()):
        raise ToolFailed(f"{name!r} is outside the work folder")
    return path


def tool_run(workdir: Path, step: Step) -> str:
    if step.tool == "list_files":
        return "\n".join(sorted(p.name for p in workdir.iterdir() if p.is_file()))
    if step.tool == "read_file":
        path = inside(workdir, step.input.get("path"))
        if not path.is_file():
            raise ToolFailed(f"{step.input.get('path')} does not exist")
        return path.read_text(encoding="utf-8")[:20000]
    if step.tool == "write_file":
        path = inside(workdir, step.input.get("path"))
        path.write_text(str(step.input.get("content", "")), encoding="utf-8")
        return f"wrote {path.name}"
    raise ToolFailed(f"unknown tool {step.tool}")


def json_object(text: str) -> dict[str, Any]:
    """The JSON object in a model's answer (models like to wrap it in prose or fences)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object in the answer")
    data = json.loads(text[start:end + 1])
    if not isinstance(data, dict):
        raise ValueError("the answer is not a JSON object")
    return data


class Planner:
    """Asks the model for steps; keeps the conversation so problems and feedback build on it."""

    def __init__(self, llm: OpenAI, model: str, goal: str) -> None:
        self.llm = llm
        self.model = model
        tools = "\n".join(f"- {t['name']}: {t['description']}; input {json.dumps(t['input_schema'])}" for t in TOOLS)
        self.messages: list[Any] = [{"role": "system", "content": SYSTEM.format(tools=tools)},
                                    {"role": "user", "content": f"Goal: {goal}"}]

    def ask(self, note: str | None = None) -> list[dict[str, Any]]:
        for _ in range(PLAN_ATTEMPTS):
            if note:
                self.messages.append({"role": "user", "content": note})
            answer = self.llm.chat.completions.create(model=self.model, messages=self.messages)
            text = answer.choices[0].message.content or ""
            self.messages.append({"role": "assistant", "content": text})
            try:
                steps = json_object(text).get("steps")
            except ValueError as exc:
                note = f"That was not valid JSON ({exc}). Answer with the JSON plan only."
                continue
            return steps if isinstance(steps, list) else []
        raise SystemExit("the model gave no JSON plan")


def submit(planner: Planner, send: Any, note: str | None = None) -> Any:
    """Ask for steps and send them; the dashboard's validation problems go back to the model."""
    steps = planner.ask(note)
    for attempt in range(PLAN_ATTEMPTS):
        try:
            return send(steps)
        except PlanInvalid as exc:
            if attempt == PLAN_ATTEMPTS - 1:
                raise
            print(f"plan rejected: {'; '.join(exc.problems) or exc.detail}", flush=True)
            steps = planner.ask("The planner rejected that plan:\n- " + "\n- ".join(exc.problems or [exc.detail])
                                + "\nFix every problem and answer with the whole JSON plan again.")
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("goal")
    parser.add_argument("--workdir", type=Path, default=Path.cwd())
    parser.add_argument("--wait", type=float, default=30.0, help="seconds per long poll")
    args = parser.parse_args(argv)
    llm = OpenAI(base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY") or "none")
    planner = Planner(llm, os.environ.get("MODEL", "gpt-4o-mini"), args.goal)
    with Client(os.environ["PLANNER_URL"], os.environ["PLANNER_TOKEN"]) as client:
        client.declare_tools(TOOLS)
        plan = submit(planner, lambda steps: client.submit_plan(args.goal, steps))
        print(f"plan {plan.id} v{plan.version} submitted: {plan.status}", flush=True)
        while True:
            try:
                for step in client.steps(plan.id, wait=args.wait):
                    print(f"step {step.key}: {step.tool} {json.dumps(step.input)[:80]}", flush=True)
                    try:
                        client.complete(step, tool_run(args.workdir, step))
                    except ToolFailed as exc:
                        client.fail(step, str(exc))
                print(f"plan {plan.id} v{plan.version} done", flush=True)
                return 0
            except ReplanNeeded as replan:
                print(f"replanning: {replan.feedback}", flush=True)
                kept = ", ".join(f"{s.key} ({s.tool})" for s in replan.kept) or "none"
                note = (f"An operator declined the plan: {replan.feedback}\nSteps already done, kept as they are: "
                        f"{kept}. Answer with the whole JSON plan for the rest, reusing their ids.")
                plan = submit(planner, lambda steps, previous=plan.id: client.submit_version(previous, steps), note)
                print(f"plan {plan.id} v{plan.version} submitted: {plan.status}", flush=True)
            except (PlanCancelled, PlanFailed) as exc:
                print(f"stopped: {exc}", flush=True)
                return 1


if __name__ == "__main__":
    sys.exit(main())
