"""The policies page in Chromium: an operator writes a policy (off until switched on), a rule that contradicts
itself is refused with the reason, the dry run shows what the policy would have decided on people's decisions,
and a viewer reads it all without a single form to change it.

The module adds its own paused tool agent, Pia, with two decisions Olga made (the runner never drives her); the
rule names Pia, so the policy decides nothing for the other tests' agents, and it is switched off at the end."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import OPERATOR, VIEWER, Login, Server, manage
from tests.browser.test_steer import screenshot

pytestmark = pytest.mark.browser

POLICIES_SCENARIO = r"""
import json
from django.contrib.auth.models import User
from agents.models import Agent
from goals.models import Goal
from planning.models import Plan, PlanEvent, PlanStep

olga = User.objects.get(username="olga")
pia = Agent.objects.create(name="Pia", backstory="Browser-test tool agent of the policies module.", kind="tool",
                           status=Agent.Status.PAUSED, cycle_interval=1.0)
goal = Goal.objects.create(agent=pia, description="Tidy the notes", horizon=Goal.Horizon.SHORT)
plan = Plan.objects.create(agent=pia, goal=goal, goal_text="Tidy the notes", status="active", approval_mode="step")
for key, tool, description, kind in [("1", "file.read", "Read Pia's notes", PlanEvent.Kind.STEP_APPROVED),
                                     ("2", "file.write", "Rewrite Pia's notes", PlanEvent.Kind.STEP_DECLINED)]:
    step = PlanStep.objects.create(plan=plan, key=key, position=int(key), description=description, tool=tool,
                                   action_hint=tool, tool_input={"path": "notes.txt"}, status="completed")
    PlanEvent.objects.create(plan=plan, step=step, kind=PlanEvent.Kind.STEP_AWAITING, actor_label="runner")
    PlanEvent.objects.create(plan=plan, step=step, kind=kind, actor=olga, actor_label="olga")
print(json.dumps({"agent": pia.pk, "plan": plan.pk}))
"""


@pytest.fixture(scope="module")
def pia(server: Server) -> Iterator[dict[str, Any]]:
    result: dict[str, Any] = json.loads(manage(server.env, "shell", "-c", POLICIES_SCENARIO).strip().splitlines()[-1])
    yield result
    manage(server.env, "shell", "-c", "from policies.models import Policy; from agents.models import Agent; "
                                      "Policy.objects.filter(name=\"Pia's reads\").delete(); "
                                      f"Agent.objects.filter(pk={result['agent']}).delete()")


def test_an_operator_writes_a_policy_tries_it_in_a_dry_run_and_switches_it_on(login: Login, pia: dict[str, Any],
                                                                             tmp_path: Path) -> None:
    page = login(OPERATOR)
    page.get_by_role("link", name="Policies").click()
    expect(page.get_by_role("heading", name="Approval policies and budgets")).to_be_visible()
    form = page.get_by_role("form", name="New policy")
    form.get_by_label("Name").fill("Pia's reads")
    form.get_by_role("button", name="Create policy").click()
    expect(page.locator("#flash [role=status]")).to_contain_text("It is off: add rules, try a dry run, then switch it on.")
    expect(page.locator("#policy-state")).to_have_text("off")

    # A decline without a reason is refused, with the reason, and nothing is added.
    page.locator("#id_new-agent").select_option(label="Pia")
    page.locator("#id_new-action").select_option("decline")
    page.get_by_role("button", name="Add rule").click()
    expect(page.locator("#flash [role=alert]")).to_contain_text("A decline needs a reason: the agent replans with it")
    expect(page.locator("#rules .empty")).to_have_text("No rule yet.")

    page.locator("#id_new-agent").select_option(label="Pia")
    page.locator("#id_new-tools").fill("file.read")
    page.locator("#id_new-action").select_option("approve")
    page.get_by_role("button", name="Add rule").click()
    expect(page.locator("#flash [role=status]")).to_have_text("Rule 1 added.")
    expect(page.locator("#rule-1 .rule-summary")).to_have_text("steps of Pia using file.read → approve")
    screenshot(page, tmp_path, "policy.png")

    page.get_by_role("link", name="Dry run").click()
    expect(page.get_by_role("heading", name="Dry run of Pia's reads")).to_be_visible()
    read = page.locator("#dry-run-rows tr", has_text="Read Pia's notes")
    expect(read).to_contain_text("approved by olga")
    expect(read).to_contain_text("approve (rule 1)")
    expect(read.locator(".tag")).to_have_text("same")
    write = page.locator("#dry-run-rows tr", has_text="Rewrite Pia's notes")
    expect(write).to_contain_text("declined by olga")
    expect(write).to_contain_text("a person decides")
    expect(page.locator("#dry-run-summary")).to_contain_text("decisions: would approve")
    screenshot(page, tmp_path, "dry_run.png")

    page.get_by_role("link", name="← Pia's reads").click()
    expect(page.locator("#policy-state")).to_have_text("off")  # a dry run changes nothing
    page.get_by_role("button", name="Switch on").click()
    expect(page.locator("#flash [role=status]")).to_have_text("Policy 'Pia's reads' is on: it decides from now on.")
    expect(page.locator("#policy-state")).to_have_text("on")
    page.get_by_role("link", name="← Policies").click()
    expect(page.locator("#policy-changes")).to_contain_text("policy 'Pia's reads' switched on · by olga")
    expect(page.locator("#policies-list tr", has_text="Pia's reads").locator(".tag")).to_have_text("on")

    # A viewer reads the same pages, without a form to change them.
    viewer = login(VIEWER)
    viewer.goto("/policies/")
    expect(viewer.locator("#policies-list")).to_contain_text("Pia's reads")
    expect(viewer.get_by_role("button", name="Create policy")).to_have_count(0)
    viewer.get_by_role("link", name="Pia's reads").click()
    expect(viewer.locator("#rule-1 .rule-summary")).to_have_text("steps of Pia using file.read → approve")
    expect(viewer.get_by_role("button")).to_have_count(1)  # only "Log out"
    viewer.get_by_role("link", name="Dry run").click()
    expect(viewer.locator("#dry-run-rows tr", has_text="Read Pia's notes")).to_contain_text("approve (rule 1)")

    page.goto("/policies/")
    page.get_by_role("link", name="Pia's reads").click()
    page.get_by_role("button", name="Switch off").click()
    expect(page.locator("#policy-state")).to_have_text("off")


def test_the_policies_pages_fit_a_phone(login: Login, pia: dict[str, Any]) -> None:
    from tests.browser.test_pages import PHONE, WIDER

    page = login(OPERATOR)
    page.goto("/policies/")
    form = page.get_by_role("form", name="New policy")
    form.get_by_label("Name").fill("Pia's phone check")
    form.get_by_role("button", name="Create policy").click()
    expect(page.locator("#policy-state")).to_have_text("off")
    policy_path = page.url
    page.set_viewport_size(PHONE)
    too_wide: dict[str, str] = {}
    try:
        for path in ["/policies/", policy_path, policy_path + "dry-run/"]:
            page.goto(path)
            width = page.evaluate("document.documentElement.scrollWidth")
            if width > PHONE["width"]:
                too_wide[path] = f"{width} px ({', '.join(page.evaluate(WIDER))})"
    finally:
        page.goto(policy_path)
        page.get_by_role("button", name="Delete policy").click()
        expect(page.locator("#flash [role=status]")).to_have_text("Policy 'Pia's phone check' deleted.")
    assert too_wide == {}, f"pages wider than {PHONE['width']} px: {too_wide}"
