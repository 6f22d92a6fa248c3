"""Live pages in real Chromium: pushes never take what an operator types or where their focus is,
changes made by another operator arrive, and pages resync after a Redis outage.

The changes are another operator's step edits, posted to the step-edit form over HTTP while the page is
open, so they are made by the serve process on both stacks (on the embedded stack only the serve process
pushes to open pages; another process's changes show when a page is next loaded).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import (
    OPERATOR,
    ROOT,
    SCENARIO,
    SECRET_KEY,
    Login,
    Server,
    free_port,
    manage,
    postgres_database_create,
    postgres_database_drop,
    stop,
    wait_until_up,
)

pytestmark = pytest.mark.browser

LIVE = 20_000  # ms

# A paused persona whose active plan has a pending step 1 and a step 2 waiting for an operator.
DORA = r"""
import json
from agents.models import Agent
from goals.models import Goal
from planning.models import Plan, PlanEvent, PlanStep
agent = Agent.objects.create(name=NAME, kind=Agent.Kind.PERSONA, status=Agent.Status.PAUSED, cycle_interval=1.0)
goal = Goal.objects.create(agent=agent, description="Cook dinner", horizon=Goal.Horizon.SHORT, source_needs=["hunger"])
plan = Plan.objects.create(agent=agent, goal=goal, goal_text="Cook dinner", status=Plan.Status.ACTIVE,
                           approval_mode=Plan.ApprovalMode.ALL, confidence=0.6, model="offline-rules")
PlanEvent.objects.create(plan=plan, kind=PlanEvent.Kind.CREATED, actor_label="scenario")
s1 = PlanStep.objects.create(plan=plan, key="1", position=1, description="Find a recipe", action_hint="relax")
s2 = PlanStep.objects.create(plan=plan, key="2", position=2, description="Buy the groceries", action_hint="buy food",
                             requires_permission=True, risk="risky", status="awaiting_approval", depends_on=["1"])
print(json.dumps({"agent": agent.pk, "plan": plan.pk, "s1": s1.pk, "s2": s2.pk}))
"""

# The step-edit form's fields of Dora's steps as DORA makes them (the form sends them all).
STEP1 = {"description": "Find a recipe", "action_hint": "relax", "tool": "", "tool_input": "{}",
         "expected_outcome": ""}
STEP2 = {"description": "Buy the groceries", "action_hint": "buy food", "tool": "", "tool_input": "{}",
         "expected_outcome": "", "requires_permission": "on"}


@pytest.fixture
def dora(server: Server) -> Iterator[dict[str, int]]:
    """Dora, for this test only: removed after it, so the shared server's dashboard shows what other tests expect."""
    out = manage(server.env, "shell", "-c", DORA.replace("NAME", repr("Dora")))
    ids = json.loads(out.strip().splitlines()[-1])
    yield ids
    manage(server.env, "shell", "-c", f"from agents.models import Agent; Agent.objects.filter(pk={ids['agent']}).delete()")


class Pusher(threading.Thread):
    """Another operator's session editing one step over HTTP, a few tenths of a second apart, then maybe
    posting one more form (`then`: a path and its fields)."""

    def __init__(self, page: Page, server: Server, *, step: int, fields: dict[str, str], field: str, prefix: str,
                 count: int = 10, then: tuple[str, dict[str, str]] | None = None) -> None:
        super().__init__(daemon=True)
        self.cookies = {c["name"]: c["value"] for c in page.context.cookies(server.url)}
        self.url, self.step, self.fields, self.field, self.prefix = server.url, step, fields, field, prefix
        self.count, self.then = count, then
        self.failures: list[str] = []

    def post(self, client: httpx.Client, path: str, data: dict[str, str]) -> None:
        answer = client.post(path, data=data, headers={"X-CSRFToken": self.cookies["csrftoken"],
                                                       "Referer": self.url + path})
        if answer.status_code >= 400:
            self.failures.append(f"POST {path}: {answer.status_code} {answer.text[:500]}")

    def run(self) -> None:
        with httpx.Client(base_url=self.url, cookies=self.cookies, timeout=30) as client:
            for i in range(self.count):
                self.post(client, f"/steps/{self.step}/edit/",
                          self.fields | {self.field: f"{self.prefix}{i}", "reason": "pushed while typing"})
                time.sleep(0.3)
            if self.then is not None:
                self.post(client, *self.then)


def pusher_start(page: Page, server: Server, **kwargs: Any) -> Pusher:
    pusher = Pusher(page, server, **kwargs)
    pusher.start()
    return pusher


def pusher_wait(pusher: Pusher) -> None:
    pusher.join(timeout=60)
    assert not pusher.is_alive(), "the other operator's edits did not finish"
    assert not pusher.failures, "the other operator's edits failed:\n" + "\n".join(pusher.failures)


def open_live(page: Page, path: str) -> None:
    page.goto(path)
    expect(page.locator("#live-status")).to_have_class(re.compile(r"\bon\b"))
    page.evaluate("window.__pushes = 0; document.addEventListener('live:applied', () => window.__pushes++)")


def active_id(page: Page) -> str:
    return str(page.evaluate("document.activeElement && document.activeElement.id"))


def test_typing_in_decline_feedback_and_replan_reason_survives_pushes(dora: dict[str, int], login: Login,
                                                                     server: Server) -> None:
    # `dora` first: her page is closed (login's teardown) before she is removed, so no late graph redraw of the
    # open page asks for her deleted plan.
    page = login(OPERATOR)
    open_live(page, f"/plans/{dora['plan']}/")
    step2 = page.locator("#step-2")

    # Decline feedback of step 2, while step 2 itself is edited by another process.
    feedback = page.locator(f"#feedback-{dora['s2']}")
    feedback.click()
    page.keyboard.type("Too pricey at the corner shop, ", delay=20)
    pusher = pusher_start(page, server, step=dora["s2"], fields=STEP2, field="expected_outcome",
                          prefix="groceries for tonight #")
    expect(step2).to_contain_text(re.compile(r"groceries for tonight #\d"), timeout=LIVE)  # pushes are arriving
    pushes_before = page.evaluate("window.__pushes")
    page.keyboard.type("try the market on Elm Street instead", delay=70)
    pusher_wait(pusher)
    expect(step2).to_contain_text("groceries for tonight #9", timeout=LIVE)
    assert page.evaluate("window.__pushes") - pushes_before >= 3, "pushes should arrive while the operator types"
    assert feedback.input_value() == "Too pricey at the corner shop, try the market on Elm Street instead"
    assert active_id(page) == f"feedback-{dora['s2']}"
    expect(page.locator("#plan-timeline")).to_contain_text("pushed while typing")

    # Replan reason in the header, while step 1 is edited and then skipped (the header's counts change).
    reason = page.locator(f"#replan-reason-{dora['plan']}")
    reason.click()
    page.keyboard.type("The recipe ", delay=20)
    skip = (f"/steps/{dora['s1']}/skip/", {"reason": "found one already"})
    pusher = pusher_start(page, server, step=dora["s1"], fields=STEP1, field="description",
                          prefix="Find a recipe, take ", count=6, then=skip)
    page.keyboard.type("needs an oven we do not have", delay=70)
    pusher_wait(pusher)
    expect(page.locator("#plan-header")).to_contain_text("1/2 steps done", timeout=LIVE)
    expect(page.locator("#step-1 .step-head .badge")).to_have_text("Skipped")
    assert reason.input_value() == "The recipe needs an oven we do not have"
    assert active_id(page) == f"replan-reason-{dora['plan']}"

    # The kept form still works: Enter sends the replan request.
    page.keyboard.press("Enter")
    expect(page.locator("#flash")).to_contain_text("Replan requested")


def test_tab_focused_link_keeps_focus_while_its_row_updates(login: Login, server: Server) -> None:
    page = login(OPERATOR)
    open_live(page, "/")
    for _ in range(80):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Jenbina":
            break
    else:
        pytest.fail("Tab never reached the link to Jenbina")
    page.evaluate("document.activeElement.__focusedByTest = true")
    row = page.locator("#agent-rows tr.agent-row").filter(has=page.get_by_role("link", name="Jenbina", exact=True))
    cycles = row.locator("td").last
    for _ in range(2):  # Jenbina cycles every 1.5 s: her row is pushed again and again
        before = cycles.inner_text()
        expect(cycles).not_to_have_text(before, timeout=LIVE)
    assert page.evaluate("document.activeElement.__focusedByTest === true"), "focus left the link"
    assert page.evaluate("document.activeElement.textContent") == "Jenbina"


def test_unknown_websocket_path_is_closed_with_a_code(login: Login, server: Server) -> None:
    page = login(OPERATOR)
    page.goto("/")
    code = page.evaluate("""() => new Promise(resolve => {
        const ws = new WebSocket(location.origin.replace('http', 'ws') + '/ws/no-such-page/');
        ws.onclose = e => resolve(e.code);
    })""")
    assert code == 4404


# --- Redis outage: the scale-out pass, against a Redis server of this test's own ------------------------------


@pytest.fixture
def outage_server() -> Iterator[tuple[Server, subprocess.Popen[bytes], list[str]]]:
    """A web server on PostgreSQL and a private redis-server (a free port; the shared one is left alone)."""
    database_url = os.environ.get("DATABASE_URL", "")
    redis_binary = shutil.which("redis-server")
    if not (database_url and os.environ.get("REDIS_URL")):
        pytest.skip("the Redis outage test runs in the scale-out pass (DATABASE_URL and REDIS_URL set)")
    if not redis_binary:
        pytest.fail("redis-server is not installed, and the scale-out pass needs it for the outage test")
    tmp = Path(tempfile.mkdtemp(prefix="planner-outage-"))
    redis_port = free_port()
    redis_cmd = [redis_binary, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(tmp)]
    redis = subprocess.Popen(redis_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    db_name = f"planner_outage_{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if k not in ("TEST_DATABASE_NAME", "DEBUG")}
    env |= {"DJANGO_SETTINGS_MODULE": "planner_site.settings", "PLANNER_VAR_DIR": str(tmp / "var"),
            "AGENT_WORKSPACES": str(tmp / "ws"), "SECRET_KEY": SECRET_KEY, "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "INFO", "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "CHANNELS_PREFIX": f"planner-outage-{os.getpid()}",
            "DATABASE_URL": postgres_database_create(database_url, db_name)}
    port = free_port()
    srv = Server(url=f"http://127.0.0.1:{port}", scenario={}, log=tmp / "server.log", scaleout=True, env=env)
    procs = [redis]
    try:
        manage(env, "migrate", "--noinput")
        srv.scenario = json.loads(manage(env, "shell", "-c", SCENARIO).strip().splitlines()[-1])
        with srv.log.open("ab") as out:
            srv.processes.append(subprocess.Popen([sys.executable, "manage.py", "serve", "--no-runner", "--port", str(port)],
                                                  cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT))
        wait_until_up(srv.url, srv.processes, srv)
        yield srv, redis, redis_cmd
    finally:
        for proc in srv.processes:
            stop(proc)
        for proc in procs:
            stop(proc)
        postgres_database_drop(database_url, db_name)
        shutil.rmtree(tmp, ignore_errors=True)


def set_status(server: Server, agent: int, status: str) -> None:
    manage(server.env, "shell", "-c",
           "from django.contrib.auth.models import User; from agents.models import Agent; from planning import services; "
           f"services.agent_set_status(agent=Agent.objects.get(pk={agent}), user=User.objects.get(username={OPERATOR[0]!r}), "
           f"status={status!r})")


def log_in(browser: Browser, url: str) -> Page:
    context = browser.new_context(base_url=url)
    page = context.new_page()
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(OPERATOR[0])
    page.get_by_label("Password").fill(OPERATOR[1])
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("header .who")).to_contain_text(OPERATOR[0])
    return page


def test_pages_resync_after_a_redis_outage(browser: Browser,
                                           outage_server: tuple[Server, subprocess.Popen[bytes], list[str]]) -> None:
    server, redis, redis_cmd = outage_server
    alice = server.scenario["alice"]["agent"]
    page = log_in(browser, server.url)
    open_live(page, "/")
    row = page.locator(f"#agent-row-{alice}")
    expect(row).to_contain_text("Paused")

    redis.terminate()
    redis.wait(timeout=10)
    # The page learns that live updates are off (the heartbeat fails), and retries.
    expect(page.locator("#live-status")).not_to_have_class(re.compile(r"\bon\b"), timeout=LIVE)
    set_status(server, alice, "running")  # its push is lost: Redis is down

    # A page opened during the outage loads, is told live updates are unavailable, and keeps retrying.
    late = page.context.new_page()
    late.goto(f"/agents/{alice}/")
    expect(late.locator("#live-status")).to_have_attribute("title", "Live updates unavailable; retrying…", timeout=LIVE)

    redis_again = subprocess.Popen(redis_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        expect(page.locator("#live-status")).to_have_class(re.compile(r"\bon\b"), timeout=30_000)
        expect(row).to_contain_text("Running")  # the change made during the outage, by the resync
        expect(late.locator("#live-status")).to_have_class(re.compile(r"\bon\b"), timeout=30_000)
        set_status(server, alice, "paused")  # and pushes flow again
        expect(row).to_contain_text("Paused", timeout=LIVE)
        expect(late.locator("#agent-header")).to_contain_text("Paused", timeout=LIVE)
    finally:
        stop(redis_again)  # type: ignore[arg-type]
