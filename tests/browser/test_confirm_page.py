"""An e-mail's Approve link on a phone: the confirmation page shows the exact step (tool and input) and one button,
fits the phone's width, and the button approves; the same link again is refused in words."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import OPERATOR, Login, PageErrors, Server, manage
from tests.browser.test_pages import PHONE, WIDER

pytestmark = pytest.mark.browser

STEP_AND_LINK = r"""
from agents.models import Agent
from notifications.confirm import confirm_link_make
from planning.models import Plan, PlanEvent, PlanStep

a = Agent.objects.create(name="Tess", backstory="Browser-test agent of the e-mail confirmation.", kind="tool",
                         status=Agent.Status.PAUSED, cycle_interval=1.0)
p = Plan.objects.create(agent=a, goal_text="Archive the invoices", status="active", approval_mode="step")
s = PlanStep.objects.create(plan=p, key="t1", position=1, description="Move last year's invoices to cold storage",
                            tool="shell", tool_input={"command": "mv /srv/invoices/2025 /archive/"},
                            status="awaiting_approval", risk="risky")
PlanEvent.objects.create(plan=p, step=s, kind=PlanEvent.Kind.STEP_AWAITING, actor_label="scenario")
print(confirm_link_make(plan=p, step=s, action="approve").split("/notifications/", 1)[1])
"""


def test_the_confirmation_page_on_a_phone_approves_once(login: Login, server: Server, page_errors: PageErrors) -> None:
    page_errors.allow("the server responded with a status of 409 (Conflict)")  # the used link, on purpose
    path = "/notifications/" + manage(server.env, "shell", "-c", STEP_AND_LINK).strip().splitlines()[-1]
    page = login(OPERATOR)
    page.set_viewport_size(PHONE)
    page.goto(path)
    expect(page.get_by_role("heading", name="Approve step t1?")).to_be_visible()
    expect(page.locator("#confirm-step-t1")).to_contain_text("mv /srv/invoices/2025 /archive/")
    expect(page.locator("#confirm-step-t1")).to_contain_text("shell")
    assert page.evaluate(WIDER) == []  # nothing wider than the phone
    buttons = page.locator("main form button")
    expect(buttons).to_have_count(1)
    buttons.click()
    expect(page.get_by_role("status")).to_contain_text("Approved step t1.")
    page.goto(path)
    expect(page.get_by_role("alert")).to_contain_text("This link was already used, by olga at")
    expect(page.locator("main form button")).to_have_count(0)
