"""An external agent with a token and declared tools, and a client that speaks to the API as that agent."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client

from agents.models import Agent, AgentToken
from tests.browser.conftest import free_port, manage, postgres_database_create, postgres_database_drop, stop

TOOLS = [
    {"name": "search", "description": "Search the company wiki", "risk": "safe",
     "input_schema": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                      "required": ["query"]}},
    {"name": "send_email", "description": "Send an email", "risk": "risky",
     "input_schema": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                      "required": ["to", "body"]}},
]


def step(key: str, tool: str = "search", *, depends: list[str] | None = None, permission: bool = False,
         **tool_input: Any) -> dict[str, Any]:
    return {"id": key, "tool": tool, "intent": f"Step {key} with {tool}",
            "input": tool_input or {"query": f"query {key}"}, "requiresPermission": permission,
            "dependencies": depends or []}


PLAN = {"goal": "Mail the Q3 summary to Dana", "steps": [
    step("1", query="q3 report"),
    step("2", depends=["1"], query="q3 figures"),
    step("3", "send_email", depends=["2"], to="dana@example.com", body="The Q3 summary is attached."),
]}


@dataclass
class ApiClient:
    """The Django test client with the agent's bearer token; JSON in, (status, JSON) out."""

    client: Client
    token: str

    def call(self, method: str, path: str, body: Any = None, *, token: str | None = None,
             raw: bytes | str | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token if token is None else token}"} if token != "" else {}
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        kwargs: dict[str, Any] = {"headers": headers}
        if data is not None:
            kwargs |= {"data": data, "content_type": "application/json"}
        response = getattr(self.client, method.lower())(path, **kwargs)
        content = json.loads(response.content) if response.content else None
        self.last = response
        return response.status_code, content

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.call("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.call("POST", path, body, **kw)

    def put(self, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        return self.call("PUT", path, body, **kw)


@pytest.fixture(autouse=True)
def rate_counters_cleared() -> None:
    cache.clear()


@pytest.fixture
def external_agent(db: None) -> Agent:
    return Agent.objects.create(name="Research bot", kind=Agent.Kind.EXTERNAL, cycle_interval=0)


@pytest.fixture
def raw_token(external_agent: Agent) -> str:
    return AgentToken.issue(agent=external_agent, label="tests")[1]


@pytest.fixture
def api(raw_token: str) -> ApiClient:
    return ApiClient(Client(), raw_token)


@pytest.fixture
def tooled(api: ApiClient) -> ApiClient:
    status, _ = api.put("/api/v1/agent/tools", {"tools": TOOLS})
    assert status == 200
    return api


# --- a real server process, for the client and the example agent --------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
CLIENT_PATH = ROOT / "clients" / "python"
if str(CLIENT_PATH) not in sys.path:
    sys.path.insert(0, str(CLIENT_PATH))  # the client is imported from this repository, as a user's checkout would
SERVER_START_SECONDS = 40
OPERATOR_LOGIN = ("olga", "olga-api-pass-1")
MAKE_OPERATOR = r"""
from django.contrib.auth.models import Group, User
u = User.objects.create_user(NAME, "", PASSWORD)
u.groups.add(Group.objects.get(name="operators"))
""".replace("NAME", repr(OPERATOR_LOGIN[0])).replace("PASSWORD", repr(OPERATOR_LOGIN[1]))


@dataclass
class LiveServer:
    url: str
    env: dict[str, str]
    log: Path

    def token(self, agent: str, *args: str) -> str:
        """A token for an external agent of this server (created if missing), from `manage.py agent_token`."""
        return manage(self.env, "agent_token", agent, *args).strip().splitlines()[-1]

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


class Operator:
    """An operator in a browser's shoes: logs in through the login form and posts decisions with the CSRF token."""

    def __init__(self, url: str) -> None:
        import httpx

        self.http = httpx.Client(base_url=url, timeout=30)
        self.http.get("/accounts/login/")
        response = self.http.post("/accounts/login/", data={
            "username": OPERATOR_LOGIN[0], "password": OPERATOR_LOGIN[1],
            "csrfmiddlewaretoken": self.http.cookies["csrftoken"]})
        assert response.status_code == 302, response.text[:500]

    def post(self, path: str, data: dict[str, str] | None = None) -> None:
        response = self.http.post(path, data=data or {}, headers={"X-CSRFToken": self.http.cookies["csrftoken"]})
        assert response.status_code in (200, 302), f"{path}: {response.status_code} {response.text[:300]}"

    def close(self) -> None:
        self.http.close()


def server_env(tmp: Path, name: str = "api_e2e") -> tuple[dict[str, str], str]:
    """The server's environment: its own SQLite file, or a PostgreSQL database of its own (scale-out pass), named
    after `name`: two servers of one test run never share (nor drop) each other's database."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "OPENAI_BASE_URL", "OPENAI_API_KEY", "LLM_MODEL",
                        "PLANNER_MODELS", "FAST_MODELS", "TEST_DATABASE_NAME", "DEBUG")}
    env |= {"DJANGO_SETTINGS_MODULE": "planner_site.settings", "SQLITE_PATH": str(tmp / "api.sqlite3"),
            "PLANNER_VAR_DIR": str(tmp / "var"), "AGENT_WORKSPACES": str(tmp / "workspaces"),
            "SECRET_KEY": "api-tests-not-secret-0123456789-abcdefghijklmnopqrstuvwxyz",
            "ALLOWED_HOSTS": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "WARNING"}
    db_name = ""
    if os.environ.get("DATABASE_URL"):
        db_name = f"planner_{name}_{os.getpid()}"
        env["DATABASE_URL"] = postgres_database_create(os.environ["DATABASE_URL"], db_name)
    if os.environ.get("REDIS_URL"):
        env["REDIS_URL"] = os.environ["REDIS_URL"]
        env["CHANNELS_PREFIX"] = f"planner-{name}-{os.getpid()}"
    return env, db_name


def server_start(env: dict[str, str], tmp: Path, *serve_args: str) -> tuple[LiveServer, subprocess.Popen[bytes]]:
    """Migrate the server's database, make the operator, start `manage.py serve` on a free port and wait until it
    answers /healthz. The caller stops the process (also when this raises: the process is then already gone)."""
    import urllib.request

    port = free_port()
    server = LiveServer(url=f"http://127.0.0.1:{port}", env=env, log=tmp / "server.log")
    manage(env, "migrate", "--noinput")
    manage(env, "shell", "-c", MAKE_OPERATOR)
    with server.log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "manage.py", "serve", "--port", str(port), *serve_args], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + SERVER_START_SECONDS
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(server.url + "/healthz", timeout=2):
                return server, proc
        except OSError:
            if time.monotonic() > deadline:
                stop(proc)
                raise RuntimeError(f"the server did not answer:\n{server.log_tail()}") from None
            time.sleep(0.2)


@contextlib.contextmanager
def live_server(request: pytest.FixtureRequest, name: str = "api_e2e", **env: str) -> Iterator[LiveServer]:
    """`manage.py serve` on a free port with a database of its own (named after `name`), an operator, and `env`
    over its environment; stopped at the end (its files kept when a test failed)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"planner-{name}-"))
    server_env_, db_name = server_env(tmp, name)
    proc = None
    try:
        server, proc = server_start(server_env_ | env, tmp)
        yield server
    finally:
        if proc is not None:
            stop(proc)
        if db_name:
            postgres_database_drop(os.environ["DATABASE_URL"], db_name)
        if not request.session.testsfailed:
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def live_server_process(request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    """`manage.py serve` on a free port with a database of its own and an operator; stopped at the end."""
    with live_server(request) as server:
        yield server


@pytest.fixture
def web_operator(live_server_process: LiveServer) -> Iterator[Operator]:
    operator = Operator(live_server_process.url)
    yield operator
    operator.close()


def eventually(check: Callable[[], Any], *, what: str, timeout: float = 60.0) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)
