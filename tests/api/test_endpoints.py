"""Every endpoint of /api/v1 and every error it can return; a refused request changes nothing."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.models import Agent, AgentToken, ApiRequest
from planning import services
from planning.models import Plan, PlanEvent, PlanStep
from tests.api.conftest import PLAN, TOOLS, ApiClient, step
from tests.factories import PlanFactory, PlanStepFactory
from tests.llm_server import answer


def snapshot() -> tuple[int, int, int, int]:
    return Plan.objects.count(), PlanStep.objects.count(), PlanEvent.objects.count(), ApiRequest.objects.count()


def approve(plan_id: int, user: Any, mode: str = Plan.ApprovalMode.ALL) -> None:
    services.plan_approve(plan=Plan.objects.get(pk=plan_id), user=user, mode=mode)


def submitted(api: ApiClient, plan: dict[str, Any] | None = None) -> int:
    status, body = api.post("/api/v1/plans", plan or PLAN)
    assert status == 201, body
    return int(body["id"])


def step_id(plan_id: int, key: str) -> int:
    return PlanStep.objects.get(plan_id=plan_id, key=key).pk


# --- authentication, authorisation, limits ------------------------------------------------------------------


def test_agent_get_shows_the_tokens_own_agent(api: ApiClient, external_agent: Agent) -> None:
    status, body = api.get("/api/v1/agent")
    assert status == 200
    assert body == {"id": external_agent.pk, "name": "Research bot", "status": "running", "approval_policy": "plan",
                    "tools": []}


@pytest.mark.parametrize("header", [None, "Token abc", "Bearer ", "Bearer apt_not-a-real-token"])
def test_missing_or_unknown_token_is_401(api: ApiClient, header: str | None) -> None:
    headers = {"Authorization": header} if header is not None else {}
    response = Client().get("/api/v1/agent", headers=headers)
    assert response.status_code == 401
    assert "Bearer" in response.json()["detail"]
    assert response["WWW-Authenticate"] == "Bearer"


def test_revoked_token_is_401(api: ApiClient) -> None:
    AgentToken.objects.update(revoked_at=timezone.now())
    assert api.get("/api/v1/agent")[0] == 401


def test_token_is_stored_hashed(raw_token: str) -> None:
    token = AgentToken.objects.get()
    assert raw_token not in (token.key_hash, token.hint)
    assert len(token.key_hash) == 64


def test_token_of_a_non_external_agent_is_403(db: None) -> None:
    agent = Agent.objects.create(name="Tool agent", kind=Agent.Kind.TOOL)
    raw = AgentToken.issue(agent=agent)[1]
    status, body = ApiClient(Client(), raw).get("/api/v1/agent")
    assert status == 403
    assert "not an external agent" in body["detail"]


def test_session_login_does_not_open_the_api(operator_client: Client, tooled: ApiClient) -> None:
    """A browser session is no credential for the API: cookies alone get 401, and nothing is stored."""
    before = snapshot()
    response = operator_client.post("/api/v1/plans", data=json.dumps(PLAN), content_type="application/json")
    assert response.status_code == 401
    assert snapshot() == before


def test_browser_routes_keep_csrf(operator: Any, tooled: ApiClient) -> None:
    plan_id = submitted(tooled)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(operator)
    response = browser.post(f"/plans/{plan_id}/approve/", {"mode": "all"})
    assert response.status_code == 403
    assert Plan.objects.get(pk=plan_id).status == Plan.Status.AWAITING_APPROVAL


def test_body_over_the_limit_is_413_and_stores_nothing(tooled: ApiClient, settings: Any) -> None:
    settings.API_MAX_BODY_BYTES = 2000
    plan = copy.deepcopy(PLAN)
    plan["steps"][0]["intent"] = "x" * 3000
    before = snapshot()
    status, body = tooled.post("/api/v1/plans", plan)
    assert status == 413
    assert "too large" in body["detail"]
    assert snapshot() == before


def test_rate_limit_per_token_is_429_then_other_tokens_still_work(api: ApiClient, external_agent: Agent,
                                                                   settings: Any) -> None:
    settings.API_RATE_LIMIT = "3/m"
    assert [api.get("/api/v1/agent")[0] for _ in range(3)] == [200, 200, 200]
    status, body = api.get("/api/v1/agent")
    assert status == 429
    assert "Too many requests" in body["detail"]
    assert int(api.last["Retry-After"]) >= 1
    other = ApiClient(Client(), AgentToken.issue(agent=external_agent)[1])
    assert other.get("/api/v1/agent")[0] == 200


def test_the_long_poll_is_rate_limited_per_token_too(tooled: ApiClient, settings: Any) -> None:
    """The long poll's rate is checked in the request's thread, not by the framework: still 429 over the rate."""
    plan_id = tooled.post("/api/v1/plans", PLAN)[1]["id"]
    settings.API_RATE_LIMIT = "4/m"  # the tools' declaration and the plan's submission counted too
    statuses = [tooled.get(f"/api/v1/plans/{plan_id}/next")[0] for _ in range(3)]
    assert statuses[0] == 200 and statuses[-1] == 429, statuses
    status, body = tooled.get(f"/api/v1/plans/{plan_id}/next")
    assert status == 429
    assert "Too many requests" in body["detail"]
    assert int(tooled.last["Retry-After"]) >= 1


def test_malformed_json_is_400(tooled: ApiClient) -> None:
    before = snapshot()
    status, body = tooled.post("/api/v1/plans", raw="{not json")
    assert status == 400
    assert body["detail"] == "The request body is not valid JSON. Nothing was changed."
    assert snapshot() == before


def test_openapi_schema_and_docs_are_served_after_login(client: Client, viewer_client: Client) -> None:
    for path in ("/api/openapi.json", "/api/docs"):
        assert client.get(path)["Location"].startswith("/accounts/login/")
    client = viewer_client
    schema = client.get("/api/openapi.json").json()
    assert {"/api/v1/plans", "/api/v1/plans/{plan_id}/next", "/api/v1/steps/{step_id}/result",
            "/api/v1/agent/tools", "/api/v1/goals", "/api/v1/plans/{plan_id}/versions"} <= set(schema["paths"])
    assert schema["components"]["securitySchemes"]["AgentTokenAuth"]["scheme"] == "bearer"
    docs = client.get("/api/docs")
    assert docs.status_code == 200
    assert b"swagger" in docs.content


def test_openapi_schema_is_served_for_an_agent_token_and_refused_for_a_wrong_one(api: ApiClient) -> None:
    status, schema = api.get("/api/openapi.json")
    assert status == 200 and "/api/v1/plans" in schema["paths"]
    status, body = api.get("/api/openapi.json", token="apt_wrong")
    assert status == 401 and "token" in body["detail"]


def test_openapi_schema_declares_typed_steps_the_rules_and_every_status(api: ApiClient) -> None:
    schema = api.get("/api/openapi.json")[1]
    components = schema["components"]["schemas"]
    step = components["StepIn"]
    assert {"id", "tool", "intent", "requiresPermission"} <= set(step["required"])
    assert step["properties"]["tool"]["pattern"] == components["ToolIn"]["properties"]["name"]["pattern"]
    assert step["additionalProperties"] is False
    assert components["PlanIn"]["properties"]["steps"]["items"] == {"$ref": "#/components/schemas/StepIn"}
    assert components["ResultIn"]["then"]["required"] == ["error"]  # succeeded: false needs an error
    for path in ("/api/v1/plans", "/api/v1/agent/tools", "/api/v1/steps/{step_id}/result"):
        for operation in schema["paths"][path].values():
            assert {"400", "401", "413", "422", "429"} <= set(operation["responses"]), path


# --- tools ---------------------------------------------------------------------------------------------------


def test_tools_put_stores_the_declaration(api: ApiClient, external_agent: Agent) -> None:
    status, body = api.put("/api/v1/agent/tools", {"tools": TOOLS})
    assert status == 200
    assert [t["name"] for t in body["tools"]] == ["search", "send_email"]
    external_agent.refresh_from_db()
    assert external_agent.declared_tools[1]["risk"] == "risky"


@pytest.mark.parametrize(("tools", "problem"), [
    ([{"name": "1bad"}], "tools.0.name: String should match pattern"),  # as the schema declares it
    ([{"name": "a"}, {"name": "a"}], "duplicate tool name 'a'"),
    ([{"name": "a", "risk": "deadly"}], "tools.0.risk: Input should be 'safe', 'risky'"),
    ([{"name": "a", "input_schema": {"type": "object", "properties": {"x": {"type": "date"}}}}],
     "tools.0.input_schema.properties.x.type: Input should be 'string'"),
    ([{"name": "a", "input_schema": {"type": "object", "properties": {}, "required": ["x"]}}], "required"),
    ([{"name": "a", "input_schema": {"type": "array"}}], "tools.0.input_schema.type: Input should be 'object'"),
])
def test_tools_put_invalid_declaration_is_422_and_keeps_the_old_one(tooled: ApiClient, external_agent: Agent,
                                                                     tools: list[Any], problem: str) -> None:
    status, body = tooled.put("/api/v1/agent/tools", {"tools": tools})
    assert status == 422
    assert any(problem in p for p in body["problems"]), body
    external_agent.refresh_from_db()
    assert [t["name"] for t in external_agent.declared_tools] == ["search", "send_email"]


def test_tools_put_unknown_field_is_422(api: ApiClient) -> None:
    status, body = api.put("/api/v1/agent/tools", {"tools": [{"name": "a", "colour": "red"}]})
    assert status == 422
    assert any("colour" in p for p in body["problems"])


# --- plans ---------------------------------------------------------------------------------------------------


def test_plan_post_valid_is_201_awaiting_approval_with_the_agent_as_actor(tooled: ApiClient,
                                                                          external_agent: Agent) -> None:
    status, body = tooled.post("/api/v1/plans", PLAN)
    assert status == 201
    plan = Plan.objects.get(pk=body["id"])
    assert body == {"id": plan.pk, "version": 1, "status": "awaiting_approval"}
    assert plan.agent == external_agent
    assert [s.key for s in plan.steps.all()] == ["1", "2", "3"]
    email = plan.steps.get(key="3")
    assert email.requires_permission and email.risk == "risky"  # a risky tool always asks
    actors = set(plan.events.values_list("actor_label", flat=True))
    assert actors == {"Research bot (API)"}
    assert set(plan.events.values_list("kind", flat=True)) == {PlanEvent.Kind.CREATED, PlanEvent.Kind.VALIDATED}


def test_plan_post_with_permission_policy_starts_at_once(tooled: ApiClient, external_agent: Agent) -> None:
    Agent.objects.filter(pk=external_agent.pk).update(approval_policy=Agent.ApprovalPolicy.PERMISSION)
    status, body = tooled.post("/api/v1/plans", PLAN)
    assert (status, body["status"]) == (201, "active")
    approved = PlanEvent.objects.get(plan_id=body["id"], kind=PlanEvent.Kind.PLAN_APPROVED)
    assert approved.actor_label == "Research bot (API)"
    assert "approval policy" in approved.reason
    assert Agent.objects.get(pk=external_agent.pk).waiting_reason == ""  # not "awaits approval" on the dashboard


@pytest.mark.parametrize(("change", "problem"), [
    (lambda p: p["steps"][0].update(tool="serch"), "unknown tool 'serch'; did you mean: search?"),
    (lambda p: p["steps"][0].update(input={"query": 3}), "search input 'query' must be string, got int"),
    (lambda p: p["steps"][0].update(input={}), "search input missing required key 'query'"),
    (lambda p: p["steps"][0].update(dependencies=["3"]), "dependency cycle"),
    (lambda p: p["steps"][1].update(dependencies=["9"]), "depends on unknown step '9'"),
    (lambda p: p["steps"][0].update(intent="rm -rf / now"), "prohibited shell command"),
])
def test_plan_post_invalid_is_422_from_the_validator_and_stores_nothing(tooled: ApiClient, change: Any,
                                                                         problem: str) -> None:
    plan = copy.deepcopy(PLAN)
    change(plan)
    before = snapshot()
    status, body = tooled.post("/api/v1/plans", plan)
    assert status == 422
    assert body["detail"] == "The plan is not valid. Nothing was stored."
    assert any(problem in p for p in body["problems"]), body["problems"]
    assert snapshot() == before


def test_plan_post_without_declared_tools_is_422(api: ApiClient) -> None:
    status, body = api.post("/api/v1/plans", PLAN)
    assert status == 422
    assert "Declare your tools first" in body["detail"]
    assert Plan.objects.count() == 0


@pytest.mark.parametrize(("body", "problem"), [
    ({"steps": []}, "body.payload.goal"),
    ({"goal": "", "steps": []}, "body.payload.goal"),
    ({"goal": "x", "steps": "1. search"}, "body.payload.steps"),
    ({"goal": "x", "steps": [], "colour": 1}, "body.payload.colour"),
])
def test_plan_post_malformed_body_is_422(tooled: ApiClient, body: dict[str, Any], problem: str) -> None:
    status, answer = tooled.post("/api/v1/plans", body)
    assert status == 422
    assert any(p.startswith(problem) for p in answer["problems"]), answer
    assert Plan.objects.count() == 0


def test_plan_get_shows_the_plan_and_hides_other_agents_plans(tooled: ApiClient) -> None:
    plan_id = submitted(tooled)
    status, body = tooled.get(f"/api/v1/plans/{plan_id}")
    assert status == 200
    assert [s["key"] for s in body["steps"]] == ["1", "2", "3"]
    assert body["steps"][2]["requiresPermission"] is True
    other = PlanFactory()
    status, body = tooled.get(f"/api/v1/plans/{other.pk}")
    assert status == 404
    assert "not found" in body["detail"]
    assert tooled.get("/api/v1/plans/999999")[0] == 404


# --- next ----------------------------------------------------------------------------------------------------


def test_next_waits_for_plan_approval_then_runs_steps_in_order(tooled: ApiClient, operator: Any) -> None:
    plan_id = submitted(tooled)
    assert tooled.get(f"/api/v1/plans/{plan_id}/next") == (200, {
        "action": "wait", "reason": "plan v1 awaits an operator's approval"})
    approve(plan_id, operator)
    status, body = tooled.get(f"/api/v1/plans/{plan_id}/next")
    assert (status, body["action"], body["step"]["key"]) == (200, "run", "1")


def test_next_puts_a_permission_step_up_for_approval_and_runs_it_once_approved(tooled: ApiClient,
                                                                                operator: Any) -> None:
    plan_id = submitted(tooled, {"goal": "Mail Dana", "steps": [
        step("1", "send_email", to="dana@example.com", body="Hello Dana, the report is ready.")]})
    Plan.objects.filter(pk=plan_id).update(status=Plan.Status.ACTIVE, approval_mode=Plan.ApprovalMode.ALL)
    status, body = tooled.get(f"/api/v1/plans/{plan_id}/next")
    assert (body["action"], body["reason"]) == ("wait", "step 1 awaits an operator's approval")
    waiting = PlanStep.objects.get(pk=step_id(plan_id, "1"))
    assert waiting.status == PlanStep.Status.AWAITING_APPROVAL
    assert PlanEvent.objects.filter(plan_id=plan_id, kind=PlanEvent.Kind.STEP_AWAITING).count() == 1
    tooled.get(f"/api/v1/plans/{plan_id}/next")  # asking again does not ask the operator twice
    assert PlanEvent.objects.filter(plan_id=plan_id, kind=PlanEvent.Kind.STEP_AWAITING).count() == 1
    services.step_approve(step=waiting, user=operator)
    status, body = tooled.get(f"/api/v1/plans/{plan_id}/next")
    assert (body["action"], body["step"]["key"]) == ("run", "1")


def test_next_after_a_decline_says_replan_with_the_feedback_and_the_kept_steps(tooled: ApiClient,
                                                                                operator: Any) -> None:
    plan_id = submitted(tooled)
    approve(plan_id, operator, Plan.ApprovalMode.STEP)
    PlanStep.objects.filter(plan_id=plan_id, key="1").update(status=PlanStep.Status.COMPLETED, result="found it")
    tooled.get(f"/api/v1/plans/{plan_id}/next")  # step 2 goes up for approval (step by step)
    services.step_decline(step=PlanStep.objects.get(pk=step_id(plan_id, "2")), user=operator,
                          feedback="Search the finance drive instead")
    status, body = tooled.get(f"/api/v1/plans/{plan_id}/next")
    assert body["action"] == "replan"
    assert body["feedback"] == "Search the finance drive instead"
    assert [s["key"] for s in body["kept"]] == ["1"]


def test_a_plan_declined_before_approval_asks_for_a_version_with_the_operators_words(
        tooled: ApiClient, operator: Any, client: Client) -> None:
    plan_id = submitted(tooled)
    client.force_login(operator)
    response = client.post(f"/plans/{plan_id}/replan/", {"reason": "Search the finance drive first"})
    assert response.status_code in (200, 302)
    status, body = tooled.get(f"/api/v1/plans/{plan_id}/next")
    assert (body["action"], body["feedback"], body["kept"]) == ("replan", "Search the finance drive first", [])
    status, created = tooled.post(f"/api/v1/plans/{plan_id}/versions", {"steps": PLAN["steps"][:1]})
    assert (status, created["version"]) == (201, 2)
    assert Plan.objects.get(pk=plan_id).status == Plan.Status.REPLANNED


def test_an_agent_withdraws_its_own_open_plan_and_is_named_on_its_timeline(tooled: ApiClient, operator: Any) -> None:
    plan_id = submitted(tooled)
    status, body = tooled.post(f"/api/v1/plans/{plan_id}/cancel", {"reason": "Went on without it"})
    assert (status, body) == (200, {"id": plan_id, "version": 1, "status": "cancelled"})
    event = PlanEvent.objects.get(plan_id=plan_id, kind=PlanEvent.Kind.PLAN_CANCELLED)
    assert (event.actor_id, event.actor_label, event.reason) == (None, "Research bot (API)", "Went on without it")
    assert set(PlanStep.objects.filter(plan_id=plan_id).values_list("status", flat=True)) == {PlanStep.Status.SKIPPED}
    assert tooled.get(f"/api/v1/plans/{plan_id}/next")[1] == {"action": "cancelled", "reason": "Went on without it"}
    status, body = tooled.post(f"/api/v1/plans/{plan_id}/cancel", {})  # closed: refused, nothing changes
    assert (status, body["detail"]) == (409, "Plan v1 is already cancelled. Nothing was changed.")
    assert PlanEvent.objects.filter(plan_id=plan_id, kind=PlanEvent.Kind.PLAN_CANCELLED).count() == 1


def test_an_agent_cannot_withdraw_another_agents_plan(tooled: ApiClient, operator: Any) -> None:
    other = PlanFactory(status=Plan.Status.ACTIVE)
    status, body = tooled.post(f"/api/v1/plans/{other.pk}/cancel", {"reason": "mine now"})
    assert status == 404
    assert Plan.objects.get(pk=other.pk).status == Plan.Status.ACTIVE
    status, body = tooled.post(f"/api/v1/plans/{other.pk}/cancel", {"reason": 7})
    assert status == 422


def test_next_reports_cancelled_done_and_failed(tooled: ApiClient, operator: Any) -> None:
    plan_id = submitted(tooled)
    services.plan_cancel(plan=Plan.objects.get(pk=plan_id), user=operator, reason="Not needed any more")
    assert tooled.get(f"/api/v1/plans/{plan_id}/next")[1] == {"action": "cancelled", "reason": "Not needed any more"}
    done = submitted(tooled)
    Plan.objects.filter(pk=done).update(status=Plan.Status.COMPLETED)
    assert tooled.get(f"/api/v1/plans/{done}/next")[1] == {"action": "done"}
    failed = submitted(tooled)
    Plan.objects.filter(pk=failed).update(status=Plan.Status.FAILED, failure_reason="abandoned")
    assert tooled.get(f"/api/v1/plans/{failed}/next")[1] == {"action": "failed", "reason": "abandoned"}


def test_next_waits_while_the_agent_is_paused(tooled: ApiClient, operator: Any, external_agent: Agent) -> None:
    plan_id = submitted(tooled)
    approve(plan_id, operator)
    services.agent_set_status(agent=external_agent, user=operator, status=Agent.Status.PAUSED)
    body = tooled.get(f"/api/v1/plans/{plan_id}/next")[1]
    assert body == {"action": "wait", "reason": "Research bot is paused by an operator"}
    status, body = tooled.post(f"/api/v1/steps/{step_id(plan_id, '1')}/start", {"request_id": "r1"})
    assert status == 409


def test_next_wait_out_of_range_is_422_and_other_agents_plan_404(tooled: ApiClient) -> None:
    plan_id = submitted(tooled)
    assert tooled.get(f"/api/v1/plans/{plan_id}/next?wait=61")[0] == 422
    assert tooled.get(f"/api/v1/plans/{plan_id}/next?wait=soon")[0] == 422
    assert tooled.get(f"/api/v1/plans/{PlanFactory().pk}/next")[0] == 404


# --- steps ---------------------------------------------------------------------------------------------------


@pytest.fixture
def running_plan(tooled: ApiClient, operator: Any) -> int:
    plan_id = submitted(tooled)
    approve(plan_id, operator)
    return plan_id


def test_step_start_and_result_complete_the_step_with_the_agent_as_actor(tooled: ApiClient, running_plan: int) -> None:
    first = step_id(running_plan, "1")
    status, body = tooled.post(f"/api/v1/steps/{first}/start", {"request_id": "start-1"})
    assert (status, body["status"]) == (200, "running")
    assert tooled.last["Idempotent-Replayed"] == "false"
    status, body = tooled.post(f"/api/v1/steps/{first}/result",
                               {"request_id": "result-1", "succeeded": True, "output": {"hits": 3}})
    assert status == 200
    assert body["step"]["status"] == "completed"
    assert PlanStep.objects.get(pk=first).result == '{"hits": 3}'
    events = PlanEvent.objects.filter(step_id=first).order_by("id")
    assert [(e.kind, e.actor_label) for e in events] == [
        (PlanEvent.Kind.STEP_STARTED, "Research bot (API)"), (PlanEvent.Kind.STEP_COMPLETED, "Research bot (API)")]
    assert tooled.get(f"/api/v1/plans/{running_plan}/next")[1]["step"]["key"] == "2"


def test_step_calls_retried_with_the_same_request_id_are_recorded_once(tooled: ApiClient, running_plan: int) -> None:
    first = step_id(running_plan, "1")
    answers = [tooled.post(f"/api/v1/steps/{first}/start", {"request_id": "s"}) for _ in range(3)]
    assert answers[0] == answers[1] == answers[2]
    assert tooled.last["Idempotent-Replayed"] == "true"
    result = {"request_id": "r", "succeeded": True, "output": "found"}
    answers = [tooled.post(f"/api/v1/steps/{first}/result", result) for _ in range(3)]
    assert answers[0] == answers[1] == answers[2]
    kinds = list(PlanEvent.objects.filter(step_id=first).values_list("kind", flat=True))
    assert sorted(kinds) == sorted([PlanEvent.Kind.STEP_STARTED, PlanEvent.Kind.STEP_COMPLETED])
    assert ApiRequest.objects.count() == 2


def test_a_request_id_reused_for_another_call_is_409(tooled: ApiClient, running_plan: int) -> None:
    first = step_id(running_plan, "1")
    tooled.post(f"/api/v1/steps/{first}/start", {"request_id": "same"})
    before = snapshot()
    status, body = tooled.post(f"/api/v1/steps/{first}/result", {"request_id": "same", "succeeded": True})
    assert status == 409
    assert "already used for start of step" in body["detail"]
    assert snapshot() == before


def test_step_start_refusals(tooled: ApiClient, running_plan: int) -> None:
    other = PlanStepFactory(plan=PlanFactory())
    before = snapshot()
    status, body = tooled.post(f"/api/v1/steps/{step_id(running_plan, '2')}/start", {"request_id": "a"})
    assert status == 409
    assert "dependencies are not done" in body["detail"]
    # "Approve all" approved the permission step 3 too: it waits only for its dependencies now.
    status, body = tooled.post(f"/api/v1/steps/{step_id(running_plan, '3')}/start", {"request_id": "b"})
    assert status == 409
    assert "dependencies are not done" in body["detail"]
    assert tooled.post(f"/api/v1/steps/{other.pk}/start", {"request_id": "c"})[0] == 404
    assert tooled.post(f"/api/v1/steps/{step_id(running_plan, '1')}/start", {})[0] == 422
    assert tooled.post(f"/api/v1/steps/{step_id(running_plan, '1')}/start", {"request_id": " "})[0] == 422
    assert snapshot() == before


def test_step_start_step_by_step_needs_the_operator_first(tooled: ApiClient, operator: Any) -> None:
    plan_id = submitted(tooled)
    approve(plan_id, operator, mode=Plan.ApprovalMode.STEP)
    before = snapshot()
    status, body = tooled.post(f"/api/v1/steps/{step_id(plan_id, '1')}/start", {"request_id": "a"})
    assert status == 409
    assert "approval first" in body["detail"]
    assert snapshot() == before


def test_step_start_on_a_plan_awaiting_approval_is_409(tooled: ApiClient) -> None:
    plan_id = submitted(tooled)
    status, body = tooled.post(f"/api/v1/steps/{step_id(plan_id, '1')}/start", {"request_id": "a"})
    assert status == 409
    assert "awaiting approval" in body["detail"]


@pytest.mark.parametrize(("change", "problem"), [
    (lambda p: p["steps"][0].pop("requiresPermission"), "steps.0.requiresPermission: Field required"),
    (lambda p: p.update(steps=[]), "steps: List should have at least 1 item"),
    (lambda p: p["steps"][0].update(tool="send email"), "steps.0.tool: String should match pattern"),
])
def test_plan_post_against_the_schema_is_422_saying_where_and_stores_nothing(tooled: ApiClient, change: Any,
                                                                             problem: str) -> None:
    plan = copy.deepcopy(PLAN)
    change(plan)
    before = snapshot()
    status, body = tooled.post("/api/v1/plans", plan)
    assert (status, body["detail"]) == (422, "The request is not valid. Nothing was changed.")
    assert any(problem in p for p in body["problems"]), body["problems"]
    assert snapshot() == before


def test_step_result_refusals(tooled: ApiClient, running_plan: int) -> None:
    first = step_id(running_plan, "1")
    status, body = tooled.post(f"/api/v1/steps/{first}/result", {"request_id": "a", "succeeded": True})
    assert status == 409
    assert "start it before reporting" in body["detail"]
    tooled.post(f"/api/v1/steps/{first}/start", {"request_id": "s"})
    before = snapshot()
    status, body = tooled.post(f"/api/v1/steps/{first}/result", {"request_id": "b", "succeeded": False})
    assert status == 422
    assert any("needs an 'error'" in p for p in body["problems"])
    assert tooled.post(f"/api/v1/steps/{first}/result", {"request_id": "c"})[0] == 422  # no 'succeeded'
    status, body = tooled.post(f"/api/v1/steps/{first}/result",
                               {"request_id": "d", "succeeded": True, "output": "x" * 20001})
    assert (status, "too long" in body["detail"]) == (422, True)
    assert snapshot() == before


def test_a_failed_result_is_retried_then_fails_and_asks_for_a_replan(tooled: ApiClient, running_plan: int) -> None:
    first = step_id(running_plan, "1")
    for attempt in range(3):
        tooled.post(f"/api/v1/steps/{first}/start", {"request_id": f"s{attempt}"})
        status, body = tooled.post(f"/api/v1/steps/{first}/result",
                                   {"request_id": f"r{attempt}", "succeeded": False, "error": "wiki down"})
        assert status == 200
    assert body["step"]["status"] == "failed"
    answer = tooled.get(f"/api/v1/plans/{running_plan}/next")[1]
    assert answer["action"] == "replan"
    assert "wiki down" in answer["reason"]


# --- versions ------------------------------------------------------------------------------------------------


def test_version_after_decline_keeps_completed_steps_and_records_the_diff(tooled: ApiClient, operator: Any) -> None:
    plan_id = submitted(tooled)
    approve(plan_id, operator, Plan.ApprovalMode.STEP)
    assert tooled.get(f"/api/v1/plans/{plan_id}/next")[1]["reason"] == "step 1 awaits an operator's approval"
    services.step_approve(step=PlanStep.objects.get(pk=step_id(plan_id, "1")), user=operator)
    first = step_id(plan_id, "1")
    tooled.post(f"/api/v1/steps/{first}/start", {"request_id": "s1"})
    tooled.post(f"/api/v1/steps/{first}/result", {"request_id": "r1", "succeeded": True, "output": "report.pdf"})
    PlanStep.objects.filter(pk=first).update(estimated_cycles=3)  # as an operator's edit left it
    tooled.get(f"/api/v1/plans/{plan_id}/next")
    services.step_decline(step=PlanStep.objects.get(pk=step_id(plan_id, "2")), user=operator, feedback="Use the finance drive")
    status, body = tooled.post(f"/api/v1/plans/{plan_id}/versions", {"steps": [
        step("2b", depends=["1"], query="finance drive q3"),
        step("3", "send_email", depends=["2b"], to="dana@example.com", body="The Q3 summary is attached."),
    ]})
    assert status == 201
    assert (body["version"], body["status"]) == (2, "awaiting_approval")
    new = Plan.objects.get(pk=body["id"])
    kept = new.steps.get(key="1")
    assert (kept.status, kept.carried_over, kept.result) == (PlanStep.Status.COMPLETED, True, "report.pdf")
    assert kept.estimated_cycles == 3  # a kept step is kept whole, its estimate too
    assert [s.key for s in new.steps.all()] == ["1", "2b", "3"]
    assert Plan.objects.get(pk=plan_id).status == Plan.Status.REPLANNED
    diff = new.events.get(kind=PlanEvent.Kind.VALIDATED).detail["diff"]
    assert diff["kept"] == ["1"] and [s["key"] for s in diff["added"]] == ["2b"]
    assert [c["key"] for c in diff["changed"]] == ["3"] and [s["key"] for s in diff["removed"]] == ["2"]
    assert tooled.get(f"/api/v1/plans/{plan_id}/next")[1]["action"] == "replanned"
    status, body = tooled.post(f"/api/v1/plans/{plan_id}/versions", {"steps": [step("9")]})
    assert status == 409  # the old version already has its next version


def test_version_refusals_store_nothing(tooled: ApiClient) -> None:
    plan_id = submitted(tooled)
    other = PlanFactory()
    before = snapshot()
    status, body = tooled.post(f"/api/v1/plans/{plan_id}/versions", {"steps": [step("1", tool="nope")]})
    assert status == 422 and any("unknown tool 'nope'" in p for p in body["problems"])
    assert tooled.post(f"/api/v1/plans/{plan_id}/versions", {"goal": "x"})[0] == 422
    assert tooled.post(f"/api/v1/plans/{other.pk}/versions", {"steps": [step("1")]})[0] == 404
    Plan.objects.filter(pk=plan_id).update(status=Plan.Status.COMPLETED)
    status, body = tooled.post(f"/api/v1/plans/{plan_id}/versions", {"steps": [step("1")]})
    assert status == 409 and "cannot get a new version" in body["detail"]
    assert snapshot() == before


def test_version_with_only_kept_steps_is_422(tooled: ApiClient, running_plan: int) -> None:
    PlanStep.objects.filter(plan_id=running_plan, key="1").update(status=PlanStep.Status.COMPLETED)
    status, body = tooled.post(f"/api/v1/plans/{running_plan}/versions", {"steps": [step("1")]})
    assert status == 422
    assert body["problems"] == ["replan has no remaining steps"]


# --- goals planned by the built-in planner, plan lists, query counts -------------------------------------------

GOAL_PLAN = json.dumps({"steps": [
    {"id": "1", "tool": "search", "intent": "Find the report", "input": {"query": "q3 report"},
     "requiresPermission": False},
    {"id": "2", "tool": "send_email", "intent": "Mail it", "input": {"to": "dana@example.com", "body": "Attached."},
     "requiresPermission": True, "dependencies": ["1"]},
]})


def test_goals_post_plans_with_the_declared_tools(tooled: ApiClient, settings: Any, llm_server: Any) -> None:
    settings.LLM_MODELS = {"planner": ["plan-model"], "fast": ["fast-model"]}
    llm_server.script("plan-model", answer(GOAL_PLAN))
    status, body = tooled.post("/api/v1/goals", {"goal": "Mail the Q3 report to Dana"})
    assert status == 201
    assert (body["version"], body["status"]) == (1, "awaiting_approval")
    plan = Plan.objects.get(pk=body["id"])
    assert [s.tool for s in plan.steps.all()] == ["search", "send_email"]
    prompt = json.dumps(llm_server.requests_for("plan-model")[0].messages)
    assert "send_email" in prompt and "web.fetch" not in prompt  # the agent's tools, not the built-in ones
    assert plan.events.get(kind=PlanEvent.Kind.CREATED).actor_label == "Research bot (API)"


def test_goals_post_refusals(api: ApiClient) -> None:
    status, body = api.post("/api/v1/goals", {"goal": "Mail the report"})
    assert (status, "Declare your tools first" in body["detail"]) == (422, True)
    assert api.post("/api/v1/goals", {"goal": ""})[0] == 422
    assert Plan.objects.count() == 0


def test_an_operator_cannot_give_an_external_agent_a_goal(external_agent: Agent, operator: Any) -> None:
    with pytest.raises(services.DecisionError, match="submits its own plans over the API"):
        services.agent_give_goal(agent=external_agent, user=operator, description="Do something")


def test_plans_get_lists_only_the_agents_own_plans_newest_first(tooled: ApiClient) -> None:
    first, second = submitted(tooled), submitted(tooled)
    PlanFactory()
    status, body = tooled.get("/api/v1/plans")
    assert status == 200
    assert [p["id"] for p in body] == [second, first]
    assert body[0] == {"id": second, "version": 1, "status": "awaiting_approval", "goal": PLAN["goal"],
                       "previous": None}


def test_plan_get_and_next_take_a_fixed_number_of_queries(tooled: ApiClient, operator: Any) -> None:
    small = submitted(tooled, {"goal": "One", "steps": [step("1")]})
    big = submitted(tooled, {"goal": "Many", "steps": [step(str(n), depends=[str(n - 1)] if n > 1 else [])
                                                       for n in range(1, 16)]})
    for plan_id in (small, big):
        approve(plan_id, operator)
    counts = []
    for plan_id in (small, big):
        for path in (f"/api/v1/plans/{plan_id}", f"/api/v1/plans/{plan_id}/next"):
            with CaptureQueriesContext(connection) as queries:
                assert tooled.get(path)[0] == 200
            counts.append(len(queries))
    assert counts[:2] == counts[2:]  # 15 steps cost what 1 step costs


@pytest.mark.parametrize(("field", "value"), [("confidence", False), ("confidence", "0.5")])
def test_plan_post_refuses_a_confidence_that_is_no_number(api: ApiClient, field: str, value: Any) -> None:
    status, body = api.post("/api/v1/plans", PLAN | {field: value})
    assert status == 422, body
    assert not Plan.objects.exists()


def test_every_answer_of_the_api_is_a_declared_type(api: ApiClient) -> None:
    """A client generated from the schema knows every field it gets back: no endpoint answers an untyped object,
    and a step reads the same (StepOut) wherever it appears."""
    schema = api.get("/api/openapi.json")[1]
    untyped = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if not path.startswith("/api/v1/"):
                continue
            for code, response in operation["responses"].items():
                body = response.get("content", {}).get("application/json", {}).get("schema", {})
                if code.startswith("2") and body.get("type") == "object" and "$ref" not in body and "properties" not in body:
                    untyped.append(f"{method.upper()} {path} {code}")
    assert untyped == []
    components = schema["components"]["schemas"]
    assert {"id", "key", "tool", "intent", "input", "status", "result", "carried_over"} <= set(components["StepOut"]["properties"])
    assert components["PlanOut"]["properties"]["steps"]["items"] == {"$ref": "#/components/schemas/StepOut"}
    assert set(components["NextOut"]["properties"]["action"]["enum"]) == {
        "run", "wait", "replan", "cancelled", "failed", "replanned", "done"}


def test_an_answer_carries_only_the_fields_of_its_action(tooled: ApiClient) -> None:
    """"wait" says why and nothing else: no null step, feedback or plan for a client to misread."""
    api = tooled
    status, created = api.post("/api/v1/plans", {"goal": "Write the weekly report", "steps": [
        {"id": "1", "tool": "search", "intent": "Find the notes", "input": {"query": "notes"}, "requiresPermission": False},
    ]})
    assert status == 201, created
    status, answer = api.get(f"/api/v1/plans/{created['id']}/next")
    assert status == 200
    assert answer["action"] in {"wait", "run"}
    if answer["action"] == "wait":
        assert set(answer) == {"action", "reason"}
    else:
        assert set(answer) == {"action", "step"} and answer["step"]["tool"] == "search"
