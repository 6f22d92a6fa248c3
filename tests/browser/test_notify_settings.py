"""The notification settings page as an operator meets it: a webhook added (its signing secret shown), a
subscription chosen, both kept after a reload; then, away from the screen, the operator's receiver gets the signed
notification when a step starts to wait, and the page lists it as delivered. Refused input is said in words."""

from __future__ import annotations

import json
import time

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import OPERATOR, Login, PageErrors, Server, manage
from tests.browser.test_pages import PHONE, WIDER
from tests.notifications.conftest import Receiver, receiver  # noqa: F401  (the webhook receiver fixture)

pytestmark = pytest.mark.browser

STEP_WAITS = r"""
from agents.models import Agent
from goals.models import Goal
from planning.models import Plan, PlanEvent, PlanStep

a = Agent.objects.create(name="Nora", backstory="Browser-test agent of the notifications module.", kind="tool",
                         status=Agent.Status.PAUSED, cycle_interval=1.0)
g = Goal.objects.create(agent=a, description="Rotate the logs", horizon=Goal.Horizon.SHORT)
p = Plan.objects.create(agent=a, goal=g, goal_text="Rotate the logs", status="active", approval_mode="step")
s = PlanStep.objects.create(plan=p, key="n1", position=1, description="Delete logs older than a week",
                            status="awaiting_approval", requires_permission=True, risk="risky")
PlanEvent.objects.create(plan=p, step=s, kind=PlanEvent.Kind.STEP_AWAITING, actor_label="scenario")
print(s.pk)
"""


def test_an_operator_subscribes_and_is_notified_by_webhook(login: Login, server: Server, page_errors: PageErrors,
                                                           receiver: Receiver) -> None:  # noqa: F811
    page_errors.allow("the server responded with a status of 400 (Bad Request)")  # the refused URL, on purpose
    page = login(OPERATOR)
    page.get_by_role("link", name="Notifications").click()
    expect(page.get_by_role("heading", name="Notifications")).to_be_visible()
    expect(page.get_by_text("No channel yet")).to_be_visible()

    page.get_by_label("URL or e-mail address").fill("ftp://nowhere.example.com/")
    page.get_by_role("button", name="Add channel").click()
    expect(page.locator("#notify-panel .flash.error")).to_contain_text("Enter a valid http:// or https:// URL. Nothing was changed.")

    page.get_by_label("Channel:", exact=True).select_option("webhook")
    page.get_by_label("URL or e-mail address").fill(receiver.url)
    page.get_by_role("button", name="Add channel").click()
    expect(page.locator("#notify-panel .flash.success")).to_contain_text("Added Webhook (signed JSON)")
    secret = page.locator("code.secret").inner_text()
    assert len(secret) >= 40
    receiver.secret = secret

    new = page.locator("#subscription-new")
    new.get_by_label("Waits for a person").check()
    new.get_by_label("Minimum risk:").select_option("risky")
    new.get_by_role("button", name="Subscribe").click()
    expect(page.locator("#notify-panel .flash.success")).to_contain_text("Subscribed.")

    page.reload()
    first = page.locator("form.subscription").first
    expect(first.get_by_label("Waits for a person")).to_be_checked()
    expect(first.get_by_label("Minimum risk:")).to_have_value("risky")
    expect(page.locator("table.notify-channels")).to_contain_text(receiver.url)

    step_id = int(manage(server.env, "shell", "-c", STEP_WAITS).strip().splitlines()[-1])

    def ours() -> list[dict[str, object]]:
        return [r.json() for r in receiver.received if (r.json().get("step") or {}).get("id") == step_id]

    deadline_count = len(receiver.received) + 1
    while not ours():
        got = receiver.wait_for(deadline_count, deadline=30)
        assert len(got) >= deadline_count, "no notification reached the receiver within 30 s"
        deadline_count += 1
    [body] = ours()
    match = next(r for r in receiver.received if (r.json().get("step") or {}).get("id") == step_id)
    assert receiver.signature_valid(match)
    assert body["title"] == "Nora: step n1 waits for your approval"
    assert json.dumps(body["step"]["risk"]) == '"risky"'

    # The receiver has the body before the runner has its answer and marks the delivery delivered: a page loaded in
    # between says "Sending" (the table is not pushed), so the operator's reload is tried again for a while.
    recent = page.locator("table.notify-recent")
    row = recent.locator("tr", has_text="Nora: step n1")
    for _ in range(30):
        page.reload()
        expect(recent).to_contain_text("Nora: step n1 waits for your approval")
        if "Delivered" in row.inner_text():
            break
        time.sleep(0.5)
    expect(row).to_contain_text("Webhook (signed JSON): Delivered")

    # The page, secrets and URLs included, does not scroll sideways on a phone.
    page.set_viewport_size(PHONE)
    page.reload()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"{width} px: {page.evaluate(WIDER)}"
