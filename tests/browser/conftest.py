"""Browser tests: real Chromium against the real server (`manage.py serve`) in a subprocess.

The server gets its own database (a temporary SQLite file, or, when DATABASE_URL is set, a temporary
PostgreSQL database on the same server, dropped afterwards), its own var/ and workspaces, and a fixed
scenario created before it starts. Nothing here uses the Django test database: the tests only look at
pages, as a user does.

With DATABASE_URL and REDIS_URL set (the scale-out pass), the web server and the runner run as two
processes (`serve --no-runner` + `runagents`), so every live update crosses Redis.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
SECRET_KEY = "browser-tests-not-secret-0123456789-abcdefghijklmnopqrstuvwxyz"
SERVER_START_SECONDS = 40
LOG_TAIL_CHARS = 6000

expect.set_options(timeout=10_000)  # a loaded CI machine is slower than a laptop

OPERATOR = ("olga", "olga-browser-pass-1")
VIEWER = ("victor", "victor-browser-pass-1")

# Run with `manage.py shell -c` against the server's database before the server starts; prints JSON.
# Alice (paused until the flow test resumes her) wants a meal: 1 go to the store, 2 buy food (spends
# money: requires permission), 3 eat after 2. Needs are comfortable, so no urgent need overrides the plan
# and the offline planner's replan is deterministic. Bob (paused for good) has a step awaiting approval.
SCENARIO = r"""
import json
from django.contrib.auth.models import Group, User
from agents.models import Agent, Need
from goals.models import Goal
from planning.models import Plan, PlanEvent, PlanStep

def user(name, password, group):
    u = User.objects.create_user(name, "", password)
    u.groups.add(Group.objects.get(name=group))

user(OPERATOR[0], OPERATOR[1], "operators")
user(VIEWER[0], VIEWER[1], "viewers")

def persona(name, backstory):
    agent = Agent.objects.create(name=name, backstory=backstory, kind=Agent.Kind.PERSONA,
                                 status=Agent.Status.PAUSED, cycle_interval=1.0)
    for need, value in {"hunger": 0.6, "energy": 0.9, "money": 0.9, "social": 0.8, "fun": 0.8}.items():
        Need.objects.create(agent=agent, name=need, satisfaction=value, decay_per_hour=0.01)
    return agent

def plan(agent, goal_text, steps, source_needs):
    goal = Goal.objects.create(agent=agent, description=goal_text, horizon=Goal.Horizon.SHORT, source_needs=source_needs)
    p = Plan.objects.create(agent=agent, goal=goal, goal_text=goal_text, status=Plan.Status.ACTIVE,
                            approval_mode=Plan.ApprovalMode.ALL, confidence=0.7, model="offline-rules",
                            thinking_summary="Written by the browser tests' scenario.")
    PlanEvent.objects.create(plan=p, kind=PlanEvent.Kind.CREATED, actor_label="scenario")
    keys = {}
    for position, spec in enumerate(steps, start=1):
        s = PlanStep.objects.create(plan=p, key=str(position), position=position, **spec)
        keys[s.key] = s.pk
    PlanEvent.objects.create(plan=p, kind=PlanEvent.Kind.VALIDATED, actor_label="scenario")
    return p, keys

alice = persona("Alice", "Browser-test persona: hungry, with money to spend.")
alice_plan, alice_steps = plan(alice, "Have a meal", [
    dict(description="Go to the store", action_hint="go to the store", expected_outcome="arrive at the store"),
    dict(description="Buy some food", action_hint="buy food", expected_outcome="have groceries", depends_on=["1"],
         requires_permission=True, risk="risky"),
    dict(description="Eat a meal", action_hint="eat", expected_outcome="no longer hungry", depends_on=["2"]),
], ["hunger"])

bob = persona("Bob", "Browser-test persona: waits for an operator, forever paused.")
bob_plan, bob_steps = plan(bob, "Catch up with Sam", [
    dict(description="Call Sam to pick a place", action_hint="call a friend", status="completed", actual_cycles=1),
    dict(description="Meet Sam for dinner", action_hint="meet friend", depends_on=["1"], requires_permission=True,
         risk="risky", status="awaiting_approval"),
], ["social"])
Agent.objects.filter(pk=bob.pk).update(waiting_reason="step 2 awaits approval")

print(json.dumps({"alice": {"agent": alice.pk, "plan": alice_plan.pk, "steps": alice_steps},
                  "bob": {"agent": bob.pk, "plan": bob_plan.pk, "steps": bob_steps}}))
""".replace("OPERATOR", repr(OPERATOR)).replace("VIEWER", repr(VIEWER))


Login = Callable[[tuple[str, str]], Page]

# Every htmx error event (htmx:oobErrorNoTarget, htmx:responseError, htmx:sendError, htmx:swapError,
# htmx:targetError...) is also dispatched as `htmx:error`: said on the console, where the listener below finds it.
HTMX_ERRORS_REPORTED = """
document.addEventListener("htmx:error", function (evt) {
  var info = (evt.detail && evt.detail.errorInfo) || {};
  console.error("htmx error event " + (info.error || "htmx:error"));
}, true);
"""


@dataclass
class PageErrors:
    """Console errors, uncaught exceptions and htmx error events of every page a test opens; any fails the test.

    A test that provokes an error on purpose says so with `allow(text)` (e.g. the browser's note of a 409)."""

    seen: list[str] = field(default_factory=list)
    allowed: list[str] = field(default_factory=list)

    def watch(self, page: Page) -> None:
        page.on("console", lambda m: self.seen.append(f"{page.url}: console {m.type}: {m.text}")
                if m.type == "error" else None)
        page.on("pageerror", lambda exc: self.seen.append(f"{page.url}: uncaught {exc}"))

    def allow(self, text: str) -> None:
        self.allowed.append(text)

    def unexpected(self) -> list[str]:
        return [e for e in self.seen if not any(a in e for a in self.allowed)]


@pytest.fixture
def page_errors() -> PageErrors:
    return PageErrors()


@dataclass
class Server:
    url: str
    scenario: dict[str, Any]
    log: Path
    scaleout: bool
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # the server's environment, for `manage(server.env, ...)`

    def log_tail(self) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no server log)"
        return text[-LOG_TAIL_CHARS:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def postgres_database_create(url: str, name: str) -> str:
    """Create `name` on the server of `url`; return the URL of the new database."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def postgres_database_drop(url: str, name: str) -> None:
    import psycopg
    from psycopg import sql

    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    except Exception as exc:  # leave the test result alone; say what is left behind
        print(f"could not drop the browser tests' database {name}: {exc}", file=sys.stderr)


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {args[0]} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result.stdout


def wait_until_up(url: str, processes: list[subprocess.Popen[bytes]], server: Server) -> None:
    deadline = time.monotonic() + SERVER_START_SECONDS
    while time.monotonic() < deadline:
        for proc in processes:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(url + "/accounts/login/", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not answer within {SERVER_START_SECONDS} s:\n{server.log_tail()}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    """The real server, on a free port, with its own database and the scenario; stopped at the end."""
    tmp = Path(tempfile.mkdtemp(prefix="planner-browser-"))
    database_url = os.environ.get("DATABASE_URL", "")
    redis_url = os.environ.get("REDIS_URL", "")
    scaleout = bool(database_url and redis_url)
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "OPENAI_BASE_URL", "OPENAI_API_KEY", "LLM_MODEL",
                        "PLANNER_MODELS", "FAST_MODELS", "TEST_DATABASE_NAME", "DEBUG")}
    env |= {
        "DJANGO_SETTINGS_MODULE": "planner_site.settings",
        "SQLITE_PATH": str(tmp / "browser.sqlite3"),
        "PLANNER_VAR_DIR": str(tmp / "var"),
        "AGENT_WORKSPACES": str(tmp / "workspaces"),
        "SECRET_KEY": SECRET_KEY,
        "RUNNER_TICK_SECONDS": "0.2",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "PYTHONUNBUFFERED": "1",
        "LOG_LEVEL": "INFO",
        # The tests' webhook receivers listen on loopback, which the outbound guard refuses unless allowed.
        "OUTBOUND_ALLOWED_NETWORKS": "127.0.0.0/8",
    }
    db_name = f"planner_browser_{os.getpid()}"
    if database_url:
        env["DATABASE_URL"] = postgres_database_create(database_url, db_name)
    if redis_url:
        env["REDIS_URL"] = redis_url
        env["CHANNELS_PREFIX"] = f"planner-browser-{os.getpid()}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp / "server.log"
    srv = Server(url=url, scenario={}, log=log, scaleout=scaleout, env=env)
    try:
        manage(env, "migrate", "--noinput")
        srv.scenario = json.loads(manage(env, "shell", "-c", SCENARIO).strip().splitlines()[-1])
        manage(env, "seed_demo", "--no-users", "--interval", "1.5")  # a livelier dashboard
        with log.open("ab") as out:
            serve = ["serve", "--port", str(port)] + (["--no-runner"] if scaleout else [])
            srv.processes.append(subprocess.Popen([sys.executable, "manage.py", *serve], cwd=ROOT, env=env,
                                                  stdout=out, stderr=subprocess.STDOUT))
            if scaleout:
                srv.processes.append(subprocess.Popen(
                    [sys.executable, "manage.py", "runagents", "--runner-id", "browser-runner"], cwd=ROOT, env=env,
                    stdout=out, stderr=subprocess.STDOUT))
        wait_until_up(url, srv.processes, srv)
        yield srv
    finally:
        for proc in srv.processes:
            stop(proc)
        if database_url:
            postgres_database_drop(database_url, db_name)
        if not request.session.testsfailed:
            shutil.rmtree(tmp, ignore_errors=True)  # else kept: the failure report names the log


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        message = f"Chromium not installed at {CHROMIUM}: apt-get install -y chromium"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + " (CI=true: browser tests must run)")
        pytest.skip(message)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def login(browser: Browser, server: Server, page_errors: PageErrors) -> Iterator[Login]:
    """Log in through the login page, in a fresh browser context (own cookies) per user. Any console error or
    htmx error event on any of its pages fails the test (see PageErrors)."""
    contexts: list[BrowserContext] = []

    def log_in(user: tuple[str, str]) -> Page:
        context = browser.new_context(base_url=server.url, viewport={"width": 1280, "height": 860})
        context.set_default_timeout(10_000)
        context.add_init_script(HTMX_ERRORS_REPORTED)
        context.on("page", page_errors.watch)
        contexts.append(context)
        page = context.new_page()
        page.goto("/accounts/login/")
        page.get_by_label("Username").fill(user[0])
        page.get_by_label("Password").fill(user[1])
        page.get_by_role("button", name="Log in").click()
        role = "viewer" if user == VIEWER else "operator"
        expect(page.locator("header .who")).to_have_text(f"{user[0]} · {role}")
        return page

    yield log_in
    for context in contexts:
        context.close()
    if page_errors.unexpected():
        pytest.fail("errors in the browser:\n" + "\n".join(page_errors.unexpected()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed browser test shows the server's log tail in its report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when == "call":
        srv = getattr(item, "funcargs", {}).get("server")
        if isinstance(srv, Server):
            report.sections.append((f"server log (tail of {srv.log})", srv.log_tail()))
