"""The offline rules model answers every purpose from the prompt's CONTEXT line, deterministically,
with plans that pass parse + validate and actually do the job when run in a workspace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agents.llm.context import prompt_context
from agents.offline_model import offline_complete
from agents.tools import TOOLS, tool_run, workspace_listing
from goals.prompts import prompt_goals, prompt_milestone
from planning.engine.parse import plan_parse
from planning.engine.prompts import (
    plan_step_directive,
    prompt_decide_action,
    prompt_plan,
    prompt_reflect,
    prompt_replan,
    prompt_restate,
)
from planning.engine.schedule import steps_runnable
from planning.engine.validate import PlanSpec, plan_validate, steps_repeating_declined

ACTIONS = ["look for work", "work", "go to the store", "buy food", "eat", "cook", "go home", "sleep",
           "call a friend", "meet friend", "relax", "idle"]
REPO = Path(__file__).resolve().parents[2]


def tool_messages(goal: str, workspace: Path | None = None, **overrides: Any) -> list[dict[str, str]]:
    arguments: dict[str, Any] = {
        "kind": "tool", "goal": goal, "restatement": None, "agent_name": "Acta", "backstory": "A careful clerk.",
        "tools": list(TOOLS.values()), "allowed_actions": (), "needs": {}, "rejection_reasons": (),
        "last_rejected_output": "", "feedback": (), "retry_hints": (), "max_steps": 20,
        "workspace_files": workspace_listing(workspace) if workspace else (),
    }
    return prompt_plan(**(arguments | overrides))


def persona_messages(goal: str, needs: Mapping[str, float], actions: Sequence[str] = ACTIONS) -> list[dict[str, str]]:
    return prompt_plan(
        kind="persona", goal=goal, restatement=None, agent_name="Jenbina", backstory="", tools=None,
        allowed_actions=actions, needs=needs, rejection_reasons=(), last_rejected_output="", feedback=(),
        retry_hints=(), max_steps=20,
    )


def accepted(text: str, kind: str, workspace: Path | None = None, actions: Sequence[str] = ACTIONS) -> PlanSpec:
    parsed = plan_parse(text)
    assert parsed.method == "json_tag" and parsed.repaired == []
    result = plan_validate(parsed.data, kind=kind, workspace=workspace, allowed_actions=actions if kind == "persona" else ())
    assert result.problems == [] and result.flags == []
    assert result.plan is not None
    return result.plan


def run_plan(plan: PlanSpec, workspace: Path) -> dict[str, str]:
    """Run every step in dependency order, as the runner would; results by step key."""
    status = {s.key: "pending" for s in plan.steps}
    by_key = {s.key: s for s in plan.steps}
    results: dict[str, str] = {}
    while keys := steps_runnable([(s.key, status[s.key], s.depends_on) for s in plan.steps]):
        step = by_key[keys[0]]
        results[step.key] = tool_run(step.tool, step.input, workspace=workspace)
        status[step.key] = "completed"
    assert set(status.values()) == {"completed"}
    return results


# -- tool plans, end to end ------------------------------------------------------------------------


def test_offline_convert_plan_converts(tmp_path: Path) -> None:
    (tmp_path / "sales.csv").write_text("month,total\njan,10\nfeb,12\n")
    plan = accepted(offline_complete("plan", tool_messages("Convert sales.csv to JSON", tmp_path)), "tool", tmp_path)
    assert [(s.tool, s.requires_permission) for s in plan.steps] == [
        ("file.read", False), ("file.convert", True), ("file.read", False)
    ]
    run_plan(plan, tmp_path)
    assert json.loads((tmp_path / "sales.json").read_text()) == [
        {"month": "jan", "total": "10"}, {"month": "feb", "total": "12"}
    ]


def test_offline_summarize_plan_writes_summaries(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "monday.txt").write_text("The roof leaks. We called a roofer. The roofer comes Friday.")
    (tmp_path / "ideas.md").write_text("Plant tomatoes in May.")
    plan = accepted(offline_complete("plan", tool_messages("Summarize my notes", tmp_path)), "tool", tmp_path)
    assert [s.tool for s in plan.steps] == ["text.summarize", "text.summarize", "report.write"]
    run_plan(plan, tmp_path)
    summaries = (tmp_path / "summaries.md").read_text()
    assert "## notes/monday.txt" in summaries and "Plant tomatoes in May." in summaries


def test_offline_sort_plan_sorts_by_extension(tmp_path: Path) -> None:
    for name in ("a.csv", "b.csv", "c.txt", "README"):
        (tmp_path / name).write_text(name)
    messages = tool_messages("Sort the files into folders by extension", tmp_path)
    plan = accepted(offline_complete("plan", messages), "tool", tmp_path)
    assert all(s.requires_permission for s in plan.steps if s.tool in ("dir.create", "file.move"))
    run_plan(plan, tmp_path)
    assert workspace_listing(tmp_path) == ["csv/", "csv/a.csv", "csv/b.csv", "other/", "other/README", "txt/", "txt/c.txt"]


def test_offline_report_plan_writes_report(tmp_path: Path) -> None:
    (tmp_path / "q1.txt").write_text("Revenue grew. Costs fell.")
    (tmp_path / "q2.txt").write_text("Revenue fell. Costs grew.")
    plan = accepted(offline_complete("plan", tool_messages("Write a report from the files", tmp_path)), "tool", tmp_path)
    assert plan.steps[0].tool == "file.list" and plan.steps[-1].tool == "report.write"
    run_plan(plan, tmp_path)
    assert (tmp_path / "report.md").read_text().count("## q") == 2


def test_offline_list_and_write_plans(tmp_path: Path) -> None:
    plan = accepted(offline_complete("plan", tool_messages("What files are in the workspace?")), "tool")
    assert [s.tool for s in plan.steps] == ["file.list"]
    goal = 'Write a note called shopping.txt saying "milk, bread"'
    plan = accepted(offline_complete("plan", tool_messages(goal)), "tool")
    run_plan(plan, tmp_path)
    assert (tmp_path / "shopping.txt").read_text() == "milk, bread\n"


def test_offline_plan_respects_max_steps(tmp_path: Path) -> None:
    for number in range(30):
        (tmp_path / f"f{number}.ext{number}").write_text("x")
    text = offline_complete("plan", tool_messages("Organize files by extension", tmp_path, max_steps=7))
    plan = accepted(text, "tool", tmp_path)
    assert len(plan.steps) == 7
    assert any("left for a later plan" in r for r in plan.risks)


# -- persona plans ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("goal", "needs", "hints"),
    [
        ("Get something to eat", {"hunger": 0.1, "money": 0.05}, ["look for work", "work", "go to the store", "buy food", "eat"]),
        ("Get something to eat", {"hunger": 0.1, "money": 0.8}, ["go to the store", "buy food", "eat"]),
        ("I am so tired", {"energy": 0.1}, ["go home", "sleep"]),
        ("Feel less lonely", {"social": 0.1, "hunger": 0.9}, ["call a friend", "meet friend"]),
        ("Make the most of today", {"social": 0.9, "energy": 0.2, "fun": 0.5}, ["go home", "sleep"]),
    ],
)
def test_offline_persona_plans(goal: str, needs: dict[str, float], hints: list[str]) -> None:
    plan = accepted(offline_complete("plan", persona_messages(goal, needs)), "persona")
    assert [s.action_hint for s in plan.steps] == hints


def test_offline_persona_plan_uses_only_the_worlds_actions() -> None:
    world = ["Work", "Buy Food", "Eat", "sleep"]
    text = offline_complete("plan", persona_messages("Get food", {"hunger": 0.1, "money": 0.1}, world))
    plan = accepted(text, "persona", actions=world)
    assert [s.action_hint for s in plan.steps] == ["Work", "Buy Food", "Eat"]


# -- determinism -----------------------------------------------------------------------------------


def test_offline_is_deterministic_across_processes(tmp_path: Path) -> None:
    for name in ("b.txt", "a.csv", "c.md"):
        (tmp_path / name).write_text("Some text. More text.")
    messages = tool_messages("Sort the files by extension", tmp_path)
    code = (
        "import json, sys\nfrom agents.offline_model import offline_complete\n"
        "print(offline_complete('plan', json.loads(sys.stdin.read())))"
    )
    outputs = set()
    for seed in ("1", "2", "3"):
        env = os.environ | {"PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        done = subprocess.run(
            [sys.executable, "-c", code], input=json.dumps(messages), capture_output=True, text=True, env=env,
            cwd=REPO, check=True,
        )
        outputs.add(done.stdout)
    assert outputs == {offline_complete("plan", messages) + "\n"}


# -- replans ---------------------------------------------------------------------------------------


def replan_messages(kind: str, goal: str, completed: list[dict[str, Any]], failed: dict[str, Any] | None,
                    reason: str, feedback: Sequence[str], **extra: Any) -> list[dict[str, str]]:
    return prompt_replan(
        kind=kind, goal=goal, agent_name="Acta", backstory="", tools=list(TOOLS.values()) if kind == "tool" else None,
        allowed_actions=ACTIONS if kind == "persona" else (), needs=extra.pop("needs", {}), completed_steps=completed,
        failed_step=failed, reason=reason, feedback=feedback, max_steps=20, **extra,
    )


def first_plan(goal: str, workspace: Path) -> PlanSpec:
    return accepted(offline_complete("plan", tool_messages(goal, workspace)), "tool", workspace)


def test_offline_replan_keeps_completed_and_follows_feedback(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("a\n1\n")
    old = first_plan("Convert data.csv to JSON", tmp_path)
    done, declined = old.steps[0], old.steps[1]
    messages = replan_messages(
        "tool", "Convert data.csv to JSON", [done.as_dict()], declined.as_dict(), "step 2 declined",
        ["Write it to out/data.json instead"], workspace_files=workspace_listing(tmp_path),
    )
    new = accepted(offline_complete("replan", messages), "tool", tmp_path)
    assert new.steps[0].as_dict() == done.as_dict()
    convert = next(s for s in new.steps if s.tool == "file.convert")
    assert convert.input["output"] == "out/data.json"
    # The description says what the step does now; the operator's words are not pasted into it (issue 50).
    assert convert.description == "Convert data.csv to JSON as out/data.json"
    assert convert.as_dict() != declined.as_dict()
    check = new.steps[-1]
    assert (check.tool, check.input, check.depends_on) == ("file.read", {"path": "out/data.json"}, [convert.key])
    run_plan(new, tmp_path)
    assert json.loads((tmp_path / "out" / "data.json").read_text()) == [{"a": "1"}]


def test_offline_replan_can_leave_a_step_out(tmp_path: Path) -> None:
    old = first_plan("Convert data.csv to JSON", tmp_path)
    messages = replan_messages("tool", "Convert data.csv to JSON", [old.steps[0].as_dict(), old.steps[1].as_dict()],
                               old.steps[2].as_dict(), "declined", ["skip the check, I trust it"])
    new = accepted(offline_complete("replan", messages), "tool")
    assert [s.key for s in new.steps][:2] == [old.steps[0].key, old.steps[1].key]
    assert all(s.input != {"path": "data.json"} or s.tool != "file.read" for s in new.steps)


def test_offline_replan_after_network_refusal_stops_fetching() -> None:
    old = accepted(offline_complete("plan", tool_messages("Download https://example.org/report.csv")), "tool")
    failed = old.steps[0].as_dict() | {"failure_reason": "network access is disabled for this agent"}
    messages = replan_messages("tool", "Download https://example.org/report.csv", [], failed, "step 1 failed", [])
    new = accepted(offline_complete("replan", messages), "tool")
    assert "web.fetch" not in [s.tool for s in new.steps]
    assert "network access is disabled" in new.steps[0].input["content"]


def test_offline_persona_replan_earns_money_first() -> None:
    old = accepted(offline_complete("plan", persona_messages("Get something to eat", {"hunger": 0.2, "money": 0.5})),
                   "persona")
    assert [s.action_hint for s in old.steps] == ["go to the store", "buy food", "eat"]
    failed = old.steps[1].as_dict() | {"failure_reason": "could not buy food: not enough money"}
    messages = replan_messages("persona", "Get something to eat", [old.steps[0].as_dict()], failed, "step 2 failed", [],
                               needs={"hunger": 0.15, "money": 0.1})
    new = accepted(offline_complete("replan", messages), "persona")
    assert [(s.key, s.action_hint) for s in new.steps] == [
        ("1", "go to the store"), ("2", "look for work"), ("3", "work"), ("4", "buy food"), ("5", "eat")
    ]
    assert new.steps[0].as_dict() == old.steps[0].as_dict()


def test_offline_persona_replan_takes_the_operators_action() -> None:
    old = accepted(offline_complete("plan", persona_messages("Feel less lonely", {"social": 0.2})), "persona")
    messages = replan_messages("persona", "Feel less lonely", [], old.steps[1].as_dict(), "declined",
                               ["too expensive, just call a friend again"], needs={"social": 0.3})
    new = accepted(offline_complete("replan", messages), "persona")
    assert [s.action_hint for s in new.steps] == ["call a friend", "call a friend"]
    assert new.steps[1].description == "Call a friend instead"  # step text does not grow by the feedback
    assert "too expensive" in new.thinking_summary


def test_offline_persona_replan_never_brings_back_a_declined_step_of_an_earlier_version() -> None:
    needs = {"hunger": 0.2, "money": 0.5}
    v1 = accepted(offline_complete("plan", persona_messages("Get something to eat", needs)), "persona")
    buy = v1.steps[1].as_dict() | {"feedback": "Too expensive; cook at home"}
    assert buy["action_hint"] == "buy food"
    # v2 cooks instead; then a later step of v2 fails and v3 is planned from the goal again.
    v2_failed = {"key": "3", "description": "Eat a meal", "action_hint": "eat", "failure_reason": "not enough money"}
    messages = replan_messages("persona", "Get something to eat", [v1.steps[0].as_dict()], v2_failed, "step 3 failed",
                               ["Too expensive; cook at home"], needs=needs, declined_steps=[buy])
    v3 = accepted(offline_complete("replan", messages), "persona")
    assert "buy food" not in [s.action_hint for s in v3.steps]
    assert "cook" in [s.action_hint for s in v3.steps]  # the operator's way, from the feedback
    assert steps_repeating_declined(v3.steps, [buy]) == []


def test_offline_persona_replan_leaves_out_a_declined_step_with_no_other_way() -> None:
    v1 = accepted(offline_complete("plan", persona_messages("Reconnect with a friend", {"social": 0.2})), "persona")
    meet = v1.steps[1].as_dict() | {"feedback": "Not this week"}
    assert meet["description"] == "Meet the friend in person"
    messages = replan_messages("persona", "Reconnect with a friend", [v1.steps[0].as_dict()], meet,
                               "step 2 declined: Not this week", ["Not this week"], needs={"social": 0.3},
                               declined_steps=[meet])
    v2 = accepted(offline_complete("replan", messages), "persona")
    assert v2.steps[0].as_dict() == v1.steps[0].as_dict()
    assert "meet friend" not in [s.action_hint for s in v2.steps]
    assert steps_repeating_declined(v2.steps[1:], [meet]) == []


def test_offline_tool_replan_skip_tuesday_drops_tuesday_from_every_step(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "monday.txt").write_text("The deploy went out on time. Two alerts fired overnight.")
    (tmp_path / "notes" / "tuesday.txt").write_text("Customers asked for CSV export. Latency is stable.")
    old = first_plan("Write a report from the notes", tmp_path)
    tuesday = next(s for s in old.steps if s.input.get("path") == "notes/tuesday.txt")
    declined = tuesday.as_dict() | {"feedback": "Skip tuesday"}
    messages = replan_messages("tool", "Write a report from the notes", [old.steps[0].as_dict()], declined,
                               f"step {tuesday.key} declined: Skip tuesday", ["Skip tuesday"],
                               workspace_files=workspace_listing(tmp_path), declined_steps=[declined])
    new = accepted(offline_complete("replan", messages), "tool", tmp_path)
    assert not any("tuesday" in json.dumps(s.as_dict()) for s in new.steps)
    report = next(s for s in new.steps if s.tool == "report.write")
    assert report.input["paths"] == ["notes/monday.txt"] and "1 file(s)" in report.description
    run_plan(new, tmp_path)
    assert "tuesday" not in (tmp_path / "report.md").read_text().lower()


def test_offline_tool_replan_skips_only_the_file_named_after_skip(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("a\n1\n")
    old = first_plan("Convert data.csv to JSON", tmp_path)
    check = old.steps[2].as_dict() | {"feedback": "Skip it, the data is fine"}
    messages = replan_messages("tool", "Convert data.csv to JSON", [old.steps[0].as_dict()], check, "declined",
                               ["Skip it, the data is fine"], workspace_files=workspace_listing(tmp_path),
                               declined_steps=[check])
    new = accepted(offline_complete("replan", messages), "tool", tmp_path)
    assert [s.tool for s in new.steps] == ["file.read", "file.convert"]  # only the declined check is left out


def test_offline_tool_replan_keeps_honouring_a_decline_of_an_earlier_version(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("a\n1\n")
    v1 = first_plan("Convert data.csv to JSON", tmp_path)
    convert = v1.steps[1].as_dict() | {"feedback": "Write it to out/data.json instead"}
    v2_failed = {"key": "3", "description": "Check the converted file", "tool": "file.read",
                 "input": {"path": "out/data.json"}, "failure_reason": "the disk was busy"}
    messages = replan_messages("tool", "Convert data.csv to JSON", [v1.steps[0].as_dict()], v2_failed,
                               "step 3 failed", ["Write it to out/data.json instead"],
                               workspace_files=workspace_listing(tmp_path), declined_steps=[convert])
    v3 = accepted(offline_complete("replan", messages), "tool", tmp_path)
    assert steps_repeating_declined(v3.steps, [convert]) == []
    new_convert = next(s for s in v3.steps if s.tool == "file.convert")
    assert new_convert.input["output"] == "out/data.json"
    assert all(s.input["path"] != "data.json" for s in v3.steps if s.tool == "file.read")


def test_offline_reflect_on_a_repeated_declined_step_says_what_the_operator_wants() -> None:
    reason = ('step 2 repeats the step the operator declined, unchanged ("Buy some food"); the operator said: '
              '"Too expensive; cook at home". Change it, replace it or leave it out.')
    hints = answer("reflect", prompt_reflect(output="{}", reasons=[reason]))["hints"]
    assert hints == ['Do what the operator said ("Too expensive; cook at home"): change the declined step, '
                     "replace it or leave it out."]


# -- the fast purposes -----------------------------------------------------------------------------


def answer(purpose: str, messages: list[dict[str, str]]) -> Any:
    return plan_parse(offline_complete(purpose, messages), allow_single_step=False).data


def test_offline_restate() -> None:
    data = answer("restate", prompt_restate(goal="Convert data.csv to JSON", agent_name="Acta", backstory=""))
    assert set(data) == {"who", "what", "when", "where", "why"}
    assert data["who"] == "Acta" and data["what"] == "Convert data.csv to JSON"
    assert data["where"] == "in Acta's workspace"


def test_offline_reflect_turns_reasons_into_hints() -> None:
    reasons = [
        "step 3: unknown tool 'file.delete_all'; did you mean: file.write, file.read?",
        "dependency cycle: 1 -> 2 -> 1",
        "step 2: file.write content looks like a placeholder ('TODO'); write the real text",
        "step 2: file.write content looks like a placeholder ('...'); write the real text",
    ]
    data = answer("reflect", prompt_reflect(output="<json>{}</json>", reasons=reasons))
    assert data == {"hints": [
        "Use only the listed tools, for example file.write, file.read.",
        "Remove the dependency cycle: dependsOn may only name steps that come earlier.",
        "Write the real file content; never TODO, '...' or <placeholders>.",
    ]}


def test_offline_goals_from_low_needs() -> None:
    messages = prompt_goals(needs={"hunger": 0.12, "energy": 0.9, "social": 0.35, "money": 0.55, "fun": 0.4},
                            personality={"openness": 0.7}, emotions={"joy": 0.2}, lessons=[],
                            existing=["Do something fun"])
    goals = answer("goals", messages)["steps"]
    assert [(g["description"], g["horizon"], g["source_needs"]) for g in goals] == [
        ("Get something to eat", "short_term", ["hunger"]),
        ("Spend time with a friend", "mid_term", ["social"]),
        ("Earn some money", "long_term", ["money"]),
    ]
    assert goals[0]["reasoning"] == "Hunger is critically low at 12%"
    assert goals[0]["recommended_actions"][0] == "eat"


@pytest.mark.parametrize(("needs", "achieved"), [({"social": 0.75, "fun": 0.5}, True), ({"social": 0.6}, False), ({}, False)])
def test_offline_milestone(needs: dict[str, float], achieved: bool) -> None:
    data = answer("milestone", prompt_milestone(goal="Make a friend", experiences=["called Sam"], needs=needs))
    assert data["achieved"] is achieved
    assert data["explanation"]


@pytest.mark.parametrize(
    ("needs", "suggested", "expected"),
    [
        ({"hunger": 0.5, "energy": 0.6}, "work", "work"),
        ({"hunger": 0.1, "energy": 0.6}, "work", "eat"),
        ({"hunger": 0.1, "energy": 0.05}, "work", "sleep"),
        ({"hunger": 0.1}, "eat", "eat"),
        ({"hunger": 0.3, "energy": 0.6}, None, "eat"),
    ],
)
def test_offline_decide(needs: dict[str, float], suggested: str | None, expected: str) -> None:
    step = plan_step_directive(goal="Earn money", number=2, total=3, description="Work a shift",
                               action_hint=suggested) if suggested else ""
    messages = prompt_decide_action(agent_name="Jenbina", needs=needs, current_step=step, goals=["Earn money"],
                                    lessons=["Working tires me"], actions=ACTIONS)
    assert answer("decide", messages)["action"] == expected


def test_offline_unknown_purpose() -> None:
    with pytest.raises(ValueError, match="no answer for purpose 'dream'"):
        offline_complete("dream", [{"role": "user", "content": "CONTEXT: {}"}])


# -- the prompts the offline model reads -----------------------------------------------------------


def test_prompts_end_with_a_one_line_context() -> None:
    messages = tool_messages("Convert data.csv", feedback=["use\nout/"], rejection_reasons=["too many steps: 27 > 20"])
    last_line = messages[-1]["content"].splitlines()[-1]
    assert last_line.startswith("CONTEXT: ")
    context = json.loads(last_line.removeprefix("CONTEXT: "))
    assert context == prompt_context(messages)
    assert context["feedback"] == ["use\nout/"] and context["reasons"] == ["too many steps: 27 > 20"]
    assert context["tools"] == list(TOOLS)


def test_prompt_plan_lists_tools_with_schema_and_risk_and_truncates_rejected_output() -> None:
    messages = tool_messages("Convert data.csv", last_rejected_output="x" * 5000, retry_hints=["Use file.convert"])
    content = messages[-1]["content"]
    assert '- file.convert {path: str, to: "json" | "csv" | "md", output?: str}' in content
    assert "[RISKY (network): requiresPermission must be true]" in content
    assert "x" * 1500 + "\n[... 3500 more characters cut]" in content and "x" * 1501 not in content
    assert "RETRY_HINTS (from a review of your rejected attempt):\n- Use file.convert" in content
    assert "<json>" in content and "You MUST:" in messages[0]["content"]


def test_prompt_plan_persona_asks_for_seed000_steps() -> None:
    content = persona_messages("Get food", {"hunger": 0.1, "energy": 0.7})[-1]["content"]
    assert "Give 2-6 ordered steps" in content
    assert "CURRENT NEEDS (satisfaction, lowest first): hunger: 10%, energy: 70%" in content
    assert '"action_hint": "call a friend"' in content  # the template's step names an action


def test_prompt_replan_says_to_keep_completed_steps() -> None:
    messages = replan_messages("tool", "Convert", [{"key": "1", "description": "Read", "tool": "file.read",
                                                    "input": {"path": "a.csv"}}], None, "operator asked", ["use b.csv"])
    content = messages[-1]["content"]
    assert "keep completed steps as they are" in content.lower()
    context = prompt_context(messages)
    assert context["purpose"] == "replan" and context["completed_steps"][0]["key"] == "1"
    assert content.count("CONTEXT: ") == 1


def test_prompt_decide_action_puts_the_plan_step_above_goals_and_lessons() -> None:
    step = plan_step_directive(goal="Eat", number=2, total=3, description="Buy some food", action_hint="buy food")
    assert step == ("Current Plan Step (follow this unless urgent needs override): Goal: Eat. "
                    "Step 2 of 3: Buy some food. Suggested action: buy food.")
    content = prompt_decide_action(agent_name="Jen", needs={"hunger": 0.3}, current_step=step, goals=["Eat"],
                                   lessons=["Stores close at 8"], actions=ACTIONS)[-1]["content"]
    assert content.index("Current Plan Step") < content.index("CURRENT GOALS") < content.index("LEARNED LESSONS")
    assert prompt_context([{"role": "user", "content": content}])["suggested_action"] == "buy food"
