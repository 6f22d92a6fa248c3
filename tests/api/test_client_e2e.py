"""The Python client and the example agent against the real server (`manage.py serve`, a subprocess), with
an operator deciding through the web pages, as in a browser."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import CLIENT_PATH, ROOT, TOOLS, LiveServer, Operator, eventually, step
from tests.llm_server import LLMTestServer, answer

pytestmark = pytest.mark.timeout(300)

from planner_client import (  # noqa: E402  (imported from clients/python, put on the path by conftest)
    AsyncClient,
    Client,
    NotFound,
    PlanCancelled,
    PlanInvalid,
    ReplanNeeded,
    Unauthorized,
)

PLAN = [step("1", query="q3 report"),
        step("2", "send_email", depends=["1"], to="dana@example.com", body="The Q3 report is attached.")]


def test_client_errors_from_the_real_server(live_server_process: LiveServer) -> None:
    with Client(live_server_process.url, "apt_wrong") as stranger, pytest.raises(Unauthorized):
        stranger.agent()
    with Client(live_server_process.url, live_server_process.token("Client errors")) as client:
        with pytest.raises(PlanInvalid, match="Declare your tools first"):
            client.submit_plan("Mail the report", PLAN)
        client.declare_tools(TOOLS)
        with pytest.raises(PlanInvalid) as invalid:
            client.submit_plan("Mail the report", [step("1", "serch")])
        assert invalid.value.problems == ["step 1: unknown tool 'serch'; did you mean: search?"]
        with pytest.raises(NotFound):
            client.plan(999999)
        assert client.plans() == []  # nothing was stored


def test_client_walks_the_steps_an_operator_allows(live_server_process: LiveServer, web_operator: Operator) -> None:
    # The agent's policy: its plans start at once, and only its permission steps wait for an operator.
    with Client(live_server_process.url, live_server_process.token("Client walker", "--policy", "permission")) as client:
        client.declare_tools(TOOLS)
        plan = client.submit_plan("Mail the report", PLAN)
        assert plan.status == "active"
        done: list[str] = []
        steps = client.steps(plan.id, wait=5)
        first = next(steps)
        assert (first.key, first.status) == ("1", "pending")
        again = client.start(first, request_id="retry-me")  # already started by the walk: still one start
        assert again == client.start(first, request_id="retry-me")
        client.complete(first, {"found": "q3.pdf"})
        done.append(first.key)

        def approve_when_asked() -> None:
            email = eventually(lambda: next((s for s in client.plan(plan.id)["steps"]
                                             if s["key"] == "2" and s["status"] == "awaiting_approval"), None),
                               what="step 2 to await approval")
            web_operator.post(f"/steps/{email['id']}/approve/")

        loop_thread = threading.Thread(target=approve_when_asked)
        loop_thread.start()
        for later in steps:  # blocks in the long poll until the operator approves step 2
            client.complete(later, "sent")
            done.append(later.key)
        loop_thread.join()
        assert done == ["1", "2"]
        state = client.plan(plan.id)
        assert state["status"] == "completed"
        assert [s["status"] for s in state["steps"]] == ["completed", "completed"]


def test_client_decline_raises_replan_needed_and_version_two_keeps_done_steps(
        live_server_process: LiveServer, web_operator: Operator) -> None:
    with Client(live_server_process.url, live_server_process.token("Client replanner", "--policy", "permission")) as client:
        client.declare_tools(TOOLS)
        plan = client.submit_plan("Mail the report", PLAN)
        with pytest.raises(ReplanNeeded) as replan:
            for item in client.steps(plan.id, wait=5):
                client.complete(item, "ok")
                if item.key == "1":
                    email = eventually(lambda: next((s for s in client.plan(plan.id)["steps"] if s["key"] == "2"
                                                     and s["status"] == "awaiting_approval"), None)
                                       if client.next(plan.id, wait=0).action == "wait" else None,
                                       what="step 2 to await approval")
                    web_operator.post(f"/steps/{email['id']}/decline/", {"feedback": "Send it to finance instead"})
        assert replan.value.feedback == "Send it to finance instead"
        assert [s.key for s in replan.value.kept] == ["1"]
        v2 = client.submit_version(plan.id, [
            step("2", "send_email", depends=["1"], to="finance@example.com", body="The Q3 report is attached.")])
        assert (v2.version, v2.status) == (2, "active")  # the agent's policy again: no plan approval
        kept = client.plan(v2.id)["steps"][0]
        assert (kept["key"], kept["status"], kept["carried_over"]) == ("1", "completed", True)
        web_operator.post(f"/plans/{v2.id}/cancel/", {"reason": "done by hand"})
        with pytest.raises(PlanCancelled):
            list(client.steps(v2.id, wait=5))


def test_async_client_runs_a_plan(live_server_process: LiveServer, web_operator: Operator) -> None:
    token = live_server_process.token("Async agent", "--policy", "permission")

    async def run() -> list[str]:
        async with AsyncClient(live_server_process.url, token) as client:
            await client.declare_tools(TOOLS)
            plan = await client.submit_plan("Look things up", [step("1"), step("2", depends=["1"])])
            assert plan.status == "active"  # the agent's policy: no plan approval, no risky step
            keys = []
            async for item in client.steps(plan.id, wait=5):
                await client.complete(item, f"result {item.key}")
                keys.append(item.key)
            return keys

    assert asyncio.run(run()) == ["1", "2"]


# --- the example agent, end to end --------------------------------------------------------------------------

NOTES = "Budget approved. Launch moved to May. Dana owns the press release."
SUMMARY = "- Budget approved\n- Launch in May\n- Dana: press release"


def model_plan(path: str) -> str:
    return json.dumps({"steps": [
        {"id": "1", "tool": "list_files", "intent": "See what is there", "input": {}, "requiresPermission": False},
        {"id": "2", "tool": "read_file", "intent": "Read the notes", "input": {"path": "meeting.txt"},
         "requiresPermission": False, "dependencies": ["1"]},
        {"id": "3", "tool": "write_file", "intent": "Write the summary", "input": {"path": path, "content": SUMMARY},
         "requiresPermission": True, "dependencies": ["2"]},
    ]})


def example_agent(server: LiveServer, llm: LLMTestServer, name: str, workdir: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, PLANNER_URL=server.url, PLANNER_TOKEN=server.token(name), OPENAI_BASE_URL=llm.base_url,
               OPENAI_API_KEY="test-key", MODEL=f"model-{name}", PYTHONPATH=str(CLIENT_PATH),
               PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, str(ROOT / "examples" / "notes_agent.py"), "--workdir", str(workdir),
                             "--wait", "5", "Summarize meeting.txt"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finished(agent: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        output, _ = agent.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        agent.kill()
        output, _ = agent.communicate()
        pytest.fail(f"the example agent did not finish:\n{output}")
    return agent.returncode, output


def latest_plan(client: Client, version: int) -> dict[str, Any] | None:
    return next((p for p in client.plans() if p["version"] == version and p["status"] == "awaiting_approval"), None)


def approved_until(operator: Operator, client: Client, plan_id: int, key: str) -> dict[str, Any] | None:
    """Step by step, as an operator at the plan page: approve each step that waits until step `key` waits;
    that one is returned, undecided (None while it does not wait yet)."""
    for s in client.plan(plan_id)["steps"]:
        if s["status"] == "awaiting_approval":
            if s["key"] == key:
                return s
            operator.post(f"/steps/{s['id']}/approve/")
    return None


@pytest.fixture
def llm() -> Any:
    with LLMTestServer() as server:
        yield server


def test_example_agent_proceeds_when_the_operator_approves(live_server_process: LiveServer, web_operator: Operator,
                                                           llm: LLMTestServer, tmp_path: Path) -> None:
    (tmp_path / "meeting.txt").write_text(NOTES)
    llm.script("model-Notes approve", answer(model_plan("summary.txt")))
    agent = example_agent(live_server_process, llm, "Notes approve", tmp_path)
    try:
        with Client(live_server_process.url, live_server_process.token("Notes approve")) as watcher:
            plan = eventually(lambda: latest_plan(watcher, 1), what="the agent's plan")
            web_operator.post(f"/plans/{plan['id']}/approve/", {"mode": "step"})
            write = eventually(lambda: approved_until(web_operator, watcher, plan["id"], "3"),
                               what="the write to await approval")
            assert not (tmp_path / "summary.txt").exists()  # the risky tool call waits for the operator
            web_operator.post(f"/steps/{write['id']}/approve/")
            code, output = finished(agent)
            assert code == 0, output
            assert (tmp_path / "summary.txt").read_text() == SUMMARY
            state = watcher.plan(plan["id"])
            assert state["status"] == "completed"
            assert NOTES in state["steps"][1]["result"]  # what the agent read is on the plan page
    finally:
        if agent.poll() is None:
            agent.kill()


def test_example_agent_replans_after_a_decline_and_keeps_its_done_steps(
        live_server_process: LiveServer, web_operator: Operator, llm: LLMTestServer, tmp_path: Path) -> None:
    (tmp_path / "meeting.txt").write_text(NOTES)
    llm.script("model-Notes decline", answer(model_plan("summary.txt")), answer(model_plan("summary.md")))
    agent = example_agent(live_server_process, llm, "Notes decline", tmp_path)
    try:
        with Client(live_server_process.url, live_server_process.token("Notes decline")) as watcher:
            v1 = eventually(lambda: latest_plan(watcher, 1), what="the agent's plan")
            web_operator.post(f"/plans/{v1['id']}/approve/", {"mode": "step"})
            write = eventually(lambda: approved_until(web_operator, watcher, v1["id"], "3"),
                               what="the write to await approval")
            web_operator.post(f"/steps/{write['id']}/decline/", {"feedback": "Write it to summary.md, in markdown"})
            v2 = eventually(lambda: latest_plan(watcher, 2), what="version 2")
            replan_prompt = llm.requests_for("model-Notes decline")[-1].messages[-1]["content"]
            assert "Write it to summary.md, in markdown" in replan_prompt
            steps = watcher.plan(v2["id"])["steps"]
            assert [(s["key"], s["status"], s["carried_over"]) for s in steps] == [
                ("1", "completed", True), ("2", "completed", True), ("3", "pending", False)]
            assert steps[2]["input"]["path"] == "summary.md"
            web_operator.post(f"/plans/{v2['id']}/approve/", {"mode": "step"})
            write = eventually(lambda: approved_until(web_operator, watcher, v2["id"], "3"),
                               what="the new write to await approval")
            web_operator.post(f"/steps/{write['id']}/approve/")
            code, output = finished(agent)
            assert code == 0, output
            assert "plan {} v2 done".format(v2["id"]) in output
            assert (tmp_path / "summary.md").read_text() == SUMMARY
            assert not (tmp_path / "summary.txt").exists()
            assert watcher.plan(v1["id"])["status"] == "replanned"
            assert output.count("step 2: read_file") == 1  # the kept read was never run again
    finally:
        if agent.poll() is None:
            agent.kill()


class LosesFirstAnswer(httpx.HTTPTransport):
    """Delivers every request, but loses the server's first answer to a step result, as a dropped connection
    would: the client must retry, and the server must not record the result twice."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytes] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.url.path.endswith("/result"):
            self.bodies.append(request.content)
            if len(self.bodies) == 1:
                response.read()
                response.close()
                raise httpx.ReadError("connection lost", request=request)
        return response


def test_client_retries_a_lost_answer_with_the_same_request_id(live_server_process: LiveServer,
                                                              web_operator: Operator) -> None:
    transport = LosesFirstAnswer()
    with Client(live_server_process.url, live_server_process.token("Lossy agent"), transport=transport) as client:
        client.declare_tools(TOOLS)
        plan = client.submit_plan("Look one thing up", [step("1")])
        web_operator.post(f"/plans/{plan.id}/approve/", {"mode": "all"})
        first = next(client.steps(plan.id, wait=5))
        answer = client.complete(first, "found")  # the first answer is lost; the retry gets the recorded one
        assert answer["step"]["status"] == "completed"
        assert len(transport.bodies) == 2 and transport.bodies[0] == transport.bodies[1]
        state = client.plan(plan.id)
        assert (state["status"], state["steps"][0]["retries"]) == ("completed", 0)
