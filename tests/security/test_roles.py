"""The role matrix over every URL the resolver knows (so a new page is covered the day it is added) and
every websocket route: anonymous callers are sent to log in or refused; viewers read and are refused every
write (403) with nothing changed; operators decide; admins see everything. Never a 500."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.apps import apps
from django.conf import settings
from django.contrib.contenttypes.models import ContentType
from django.db import models
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve, reverse

from agents.models import Agent, AgentToken
from goals.models import Goal
from planning.models import Plan, PlanEvent, PlanStep
from tests.factories import (
    AgentFactory,
    ExperienceFactory,
    LessonFactory,
    LLMCallFactory,
    NeedFactory,
    PlanFactory,
    PlanStepFactory,
    UserFactory,
)

# Reachable without login: the login page itself, the load balancer's health check, and the API's schema
# and docs (a description of the endpoints, no data; the endpoints themselves need a token).
PUBLIC = {"login", "healthz", "admin:login", "api:openapi-json", "api:openapi-view",
          # Remote A2A agents POST their tasks' updates here: no session, each task's own secret token
          # (without it: 401 and nothing changed, tests/a2a/test_a2a_push.py).
          "a2a-push"}
# Every signed-in user may use these on their own account (log out, change their own password).
ACCOUNT = {"logout", "password_change", "password_change_done", "admin:logout", "admin:password_change",
           "admin:password_change_done", "login", "admin:login", "password_reset", "password_reset_done",
           "password_reset_confirm", "password_reset_complete",
           # Each user's own subscriptions (a viewer may want to hear that something waits, too);
           # tests/notifications/test_pages.py shows nobody reaches another user's. Channels are not here: a
           # viewer may add only e-mail to their own address (test_every_url_that_accepts_a_write_refuses_a_viewer).
           "notify-settings", "notify-subscription-add", "notify-subscription-save", "notify-subscription-remove",
           "notify-link",
           # an e-mail's confirmation page (like notify-link it only finds the item: deciding checks the role, a
           # viewer's POST is refused there, tests/notifications/test_confirm.py); one's own Slack account
           "notify-confirm", "notify-slack-connect"}
MODELS_BY_SEGMENT: dict[str, type[models.Model]] = {
    "agents": Agent, "plans": Plan, "steps": PlanStep, "goals": Goal, "events": PlanEvent,
}
MODELS_BY_KWARG: dict[str, type[models.Model]] = {
    "agent_id": Agent, "plan_id": Plan, "step_id": PlanStep, "goal_id": Goal, "event_id": PlanEvent,
}
WRITE_ADMIN_VIEWS = ("_add", "_change", "_delete")


MISSING = 999_999  # the id given for an admin object of a model with no row here


@dataclass
class Page:
    name: str
    url: str
    admin: bool
    missing: bool = False  # an admin page of an object that does not exist: the admin redirects to its index

    @property
    def operator_page(self) -> bool:
        return resolve(self.url).func.__module__ == "planning.views"


def patterns(resolvers: list[Any], prefix: str = "", namespace: str = "") -> Iterator[tuple[str, str, Any, str]]:
    """(qualified name, route, callback, route prefix) of every named URL pattern."""
    for entry in resolvers:
        if isinstance(entry, URLResolver):
            ns = ":".join(filter(None, [namespace, entry.namespace or ""]))
            yield from patterns(entry.url_patterns, prefix + str(entry.pattern), ns)
        elif isinstance(entry, URLPattern) and entry.name:
            yield ":".join(filter(None, [namespace, entry.name])), prefix + str(entry.pattern), entry.callback, prefix


def kwarg_value(name: str, route: str, callback: Any, objects: dict[type[models.Model], models.Model]) -> Any:
    model_admin = getattr(callback, "model_admin", None)
    if name == "app_label":
        return "planning"
    if name == "content_type_id":
        return ContentType.objects.get_for_model(Plan).pk
    if name == "object_id":
        model = model_admin.model if model_admin else Plan
        obj = objects.get(model) or model._default_manager.order_by("pk").first()
        return obj.pk if obj else MISSING
    if name in ("uidb64", "token"):
        return "x"
    if choices := re.search(rf"\(\?P<{name}>([\w|]+)\)", route):  # a regex group of alternatives: the first one
        return choices.group(1).split("|")[0]
    segment = re.search(rf"([\w-]+)/<(?:\w+:)?{name}>", route)
    model = MODELS_BY_SEGMENT.get(segment.group(1)) if segment else None
    model = model or MODELS_BY_KWARG.get(name)
    if model is not None and model in objects:
        return objects[model].pk
    return 1  # a parameter this test does not know: the page may answer 404, never 500


def every_page(objects: dict[type[models.Model], models.Model]) -> list[Page]:
    pages = []
    for name, route, callback, _ in patterns(get_resolver().url_patterns):
        keys = re.findall(r"<(?:\w+:)?(\w+)>", route) + re.findall(r"\(\?P<(\w+)>", route)
        kwargs = {k: kwarg_value(k, route, callback, objects) for k in keys}
        # A regex group that lists its values (e.g. "csv|json"): the first of them.
        for key, choices in re.findall(r"\(\?P<(\w+)>([\w|.-]+)\)", route):
            if "|" in choices and key != "app_label":
                kwargs[key] = choices.split("|")[0]
        try:
            url = reverse(name, kwargs=kwargs)
        except Exception as exc:  # noqa: BLE001 - say which page could not be built
            raise AssertionError(f"cannot build a URL for {name} ({route}) with {kwargs}: {exc}") from exc
        pages.append(Page(name, url, name.startswith("admin:"), missing=MISSING in kwargs.values()))
    return pages


@pytest.fixture
def world(db: None) -> dict[type[models.Model], models.Model]:
    """One row of every model, with a plan waiting for decisions."""
    agent = AgentFactory(kind="tool")
    plan = PlanFactory(agent=agent, status=Plan.Status.ACTIVE)
    step = PlanStepFactory(plan=plan, status=PlanStep.Status.AWAITING_APPROVAL, requires_permission=True,
                           tool="file.read", tool_input={"path": "a.csv"})
    event = PlanEvent.objects.create(plan=plan, step=step, kind=PlanEvent.Kind.CREATED, actor_label="runner")
    need = NeedFactory(agent=agent)
    rows: list[models.Model] = [agent, plan, step, event, need, plan.goal, ExperienceFactory(agent=agent),
                                LessonFactory(agent=agent), LLMCallFactory(agent=agent, plan=plan),
                                AgentToken.issue(agent=agent)[0]]
    return {type(row): row for row in rows}


def user_client(role: str) -> Client:
    client = Client(raise_request_exception=False)  # a server error counts as a 500, as a browser sees it
    if role == "viewer":
        client.force_login(UserFactory(username="victor", role="viewers", is_staff=True))
    elif role == "operator":
        client.force_login(UserFactory(username="olga", role="operators", is_staff=True))
    elif role == "admin":
        client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


def snapshot() -> dict[str, list[dict[str, Any]]]:
    """Every row of the product's tables (and users and groups)."""
    tables = [m for m in apps.get_models() if m._meta.app_label in ("agents", "goals", "planning", "policies", "auth")]
    return {m._meta.label: list(m._default_manager.order_by("pk").values()) for m in tables}


def to_login(response: Any) -> bool:
    location = response.get("Location", "")
    return response.status_code == 302 and location.startswith((settings.LOGIN_URL, "/admin/login/"))


def test_the_matrix_covers_the_pages_users_know(world: dict[type[models.Model], models.Model]) -> None:
    names = {page.name for page in every_page(world)}
    assert {"dashboard", "plan-detail", "step-approve", "plan-cancel", "admin:planning_planstep_change"} <= names


def test_anonymous_is_sent_to_login_or_refused_everywhere(world: dict[type[models.Model], models.Model]) -> None:
    client = user_client("anonymous")
    for page in every_page(world):
        for method in ("get", "post"):
            response = getattr(client, method)(page.url)
            where = f"{method.upper()} {page.url} ({page.name}): {response.status_code}"
            assert response.status_code != 500, where
            if page.name not in PUBLIC:
                assert to_login(response) or response.status_code in (401, 403, 404, 405), where


def test_viewer_reads_and_every_write_is_refused(world: dict[type[models.Model], models.Model]) -> None:
    client = user_client("viewer")
    pages = every_page(world)
    for name in ("dashboard", "agent-detail", "plan-detail"):
        page = next(p for p in pages if p.name == name)
        assert client.get(page.url).status_code == 200, page.url
    before = snapshot()
    for page in pages:
        response = client.get(page.url)
        assert response.status_code != 500, f"GET {page.url} ({page.name})"
        if page.name in ACCOUNT | PUBLIC:
            continue
        response = client.post(page.url, {"reason": "x", "feedback": "x", "mode": "all", "status": "paused"})
        where = f"POST {page.url} ({page.name}): {response.status_code}"
        assert response.status_code != 500, where
        if page.missing:
            assert response.status_code in (302, 403), where
        elif page.operator_page:  # the operator's own pages: a viewer's write is forbidden, in so many words
            assert response.status_code in (403, 405), where
        elif not page.admin or page.name.endswith(WRITE_ADMIN_VIEWS):
            assert response.status_code in (401, 403, 404, 405), where  # 401: the API wants its token
    assert snapshot() == before  # read only: not one row changed


def test_operator_may_open_every_page_and_decide(world: dict[type[models.Model], models.Model]) -> None:
    client = user_client("operator")
    for page in every_page(world):
        response = client.get(page.url)
        where = f"GET {page.url} ({page.name}): {response.status_code}"
        assert response.status_code != 500, where
        if not page.admin:
            assert response.status_code != 403, where
    step = world[PlanStep]
    assert client.post(reverse("step-approve", args=[step.pk])).status_code in (200, 302)
    step.refresh_from_db()
    assert step.status == PlanStep.Status.PENDING


def test_operator_writes_never_end_in_a_server_error(world: dict[type[models.Model], models.Model]) -> None:
    client = user_client("operator")
    for page in every_page(world):
        if page.name in ACCOUNT | PUBLIC:
            continue
        response = client.post(page.url, {})
        where = f"POST {page.url} ({page.name}): {response.status_code}"
        assert response.status_code != 500, where
        if not page.admin:
            assert response.status_code != 403, where  # operators are allowed; a refusal says why (400/409)
        elif page.name.endswith("_delete"):
            assert response.status_code == 403, where  # deleting is for admins only


def test_admin_opens_every_page(world: dict[type[models.Model], models.Model]) -> None:
    client = user_client("admin")
    for page in every_page(world):
        response = client.get(page.url)
        assert response.status_code != 500, f"GET {page.url} ({page.name})"


def test_decisions_need_the_csrf_token(world: dict[type[models.Model], models.Model]) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(UserFactory(username="olga", role="operators"))
    before = snapshot()
    for page in every_page(world):
        if page.admin or page.name in PUBLIC | ACCOUNT:
            continue
        response = client.post(page.url, {"reason": "x", "feedback": "x", "mode": "all", "status": "paused"})
        # 401: the API authenticates by token, never by the session cookie, so there is nothing to forge.
        assert response.status_code in (401, 403, 405), f"POST {page.url} ({page.name}) without a CSRF token"
    assert snapshot() == before


# --- websockets -------------------------------------------------------------------------------------------


def socket_routes() -> list[Any]:
    """Every route of the websocket router the server really runs (inside its Origin and session checks)."""
    from channels.routing import URLRouter

    from planner_site.asgi import application

    routers, apps = [], [application.application_mapping["websocket"]]
    while apps:  # through the Origin and session checks; the API's sockets and the browser's apart
        app = apps.pop(0)
        if isinstance(app, URLRouter):
            routers.append(app)
        elif hasattr(app, "api") and hasattr(app, "browser"):
            apps += [app.api, app.browser]
        else:
            apps.append(getattr(app, "inner", None) or app.application)
    routes: list[Any] = []
    stack = [route for router in routers for route in router.routes]
    while stack:
        route = stack.pop(0)
        if isinstance(getattr(route, "callback", None), URLRouter):
            stack.extend(route.callback.routes)
        else:
            routes.append(route)
    return routes


def socket_paths(objects: dict[type[models.Model], models.Model]) -> list[str]:
    paths = []
    for entry in socket_routes():
        route = "/" + str(entry.pattern).lstrip("^").rstrip("$")
        for key in re.findall(r"<(?:\w+:)?(\w+)>", route):
            value = kwarg_value(key, route, None, objects)
            route = re.sub(rf"<(?:\w+:)?{key}>", str(value), route)
        paths.append(route)
    return paths


async def socket_connect(path: str, client: Client | None) -> tuple[bool, int | str | None, str]:
    from planner_site.asgi import application

    headers = [(b"origin", b"http://localhost")]
    if client is not None:
        cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()))
    comm = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await comm.connect(timeout=10)
    first = ""
    if connected:  # accepted, then either the page's first state or a close with a code
        message = await comm.receive_output(timeout=10)
        if message["type"] == "websocket.close":
            connected, code = False, message.get("code")
        else:
            first = message.get("text", "")
    await comm.disconnect()
    return connected, code, first


@pytest.mark.django_db(transaction=True)
async def test_every_websocket_refuses_anonymous_and_serves_each_role() -> None:
    objects = await sync_to_async(lambda: {type(r): r for r in (PlanStepFactory().plan, )})()
    plan = next(iter(objects.values()))
    assert isinstance(plan, Plan)
    objects[Agent] = await sync_to_async(lambda: plan.agent)()
    paths = await sync_to_async(socket_paths)(objects)
    assert paths, "no websocket routes found"
    clients = {role: await sync_to_async(user_client)(role) for role in ("viewer", "operator", "admin")}
    pages = {"/ws/dashboard/", f"/ws/agents/{plan.agent_id}/", f"/ws/plans/{plan.pk}/"}
    assert pages <= set(paths), paths
    for path in paths:
        connected, code, _ = await socket_connect(path, None)
        assert not connected and code is not None, f"anonymous connected to {path}"
        for role, client in clients.items():
            connected, code, first = await socket_connect(path, client)
            if path in pages:  # the live pages: every signed-in role watches them
                assert connected, f"{role} could not open {path} (closed with {code})"
            else:  # other sockets (e.g. the API's, with its own tokens) may refuse, but with a close code
                assert connected or code is not None, path
            if role == "viewer":
                assert ">Approve<" not in first and ">Decline<" not in first, path


@pytest.mark.django_db(transaction=True)
async def test_unknown_websocket_path_is_closed_with_a_code() -> None:
    client = await sync_to_async(user_client)("viewer")
    for path in ("/ws/no-such-page/", "/ws/plans/abc/", "/nothing"):
        connected, code, _ = await socket_connect(path, client)
        assert not connected and isinstance(code, int) and code >= 1000, path


# --- every write, by a viewer ----------------------------------------------------------------------------------

WRITE_METHODS = ("post", "put", "patch", "delete")
# The only writes a viewer may make, each on their own account, and why:
VIEWER_OWN_WRITES = {
    # Signing in and out, and one's own password.
    "login": "signs in", "logout": "signs out", "admin:login": "signs in", "admin:logout": "signs out",
    "password_change": "one's own password", "admin:password_change": "one's own password",
    "password_reset": "mails a reset link to the account's own address",
    "password_reset_confirm": "sets one's own password with a mailed token",
    # What one is told: subscriptions only choose which notifications reach one's own channels, and a viewer's
    # channels are e-mail to their own address (tests/notifications/test_outbound.py); turning off or removing
    # one's own channel only stops sending (notify-channel-change refuses a viewer every other change: below).
    "notify-subscription-add": "one's own subscriptions", "notify-subscription-save": "one's own subscriptions",
    "notify-subscription-remove": "one's own subscriptions",
    # An e-mail's confirmation page only finds the item; deciding there checks the role (a viewer's POST is
    # refused: tests/notifications/test_confirm.py). Slack's interactions authenticate by Slack's signature, not
    # the session (unsigned: 401), and decide only for a connected operator (tests/notifications/test_slack_app.py);
    # the connect code only ties one's own Slack account to one's own account.
    "notify-confirm": "finds the item; deciding checks the role",
    "notify-slack-interactions": "signed by Slack, not a session; decides only for operators",
    "notify-slack-connect": "connects one's own Slack account",
    # A remote A2A agent's push notification: its task's token, not the session (without it: 401, nothing
    # changed; an unknown task: 404; tests/a2a/test_a2a_push.py); it records only that task's own updates.
    "a2a-push": "authenticated by a task's token, not a session; records that task's updates only",
}


def test_every_url_that_accepts_a_write_refuses_a_viewer(world: dict[type[models.Model], models.Model]) -> None:
    """Walks the resolver: a new view that accepts POST, PUT, PATCH or DELETE is covered the day it is added,
    and a viewer is refused (403; the API, which takes no session, 401) with nothing changed."""
    from notifications.models import Channel

    client = user_client("viewer")
    viewer = UserFactory._meta.model.objects.get(username="victor")
    hook = Channel.objects.create(user=viewer, kind="webhook", target="https://hooks.example.com/v", secret="s",
                                  active=False)
    before = snapshot() | {"channels": list(Channel.objects.order_by("pk").values())}
    accepted, wrong = [], []
    for page in every_page(world):
        if page.name in VIEWER_OWN_WRITES:
            continue
        url = page.url
        if page.name == "notify-channel-change":
            url = reverse(page.name, args=[hook.pk, "on"])
        for method in WRITE_METHODS:
            response = getattr(client, method)(url, {"kind": "webhook", "target": "https://hooks.example.com/x",
                                                     "reason": "x", "feedback": "x", "mode": "all",
                                                     "status": "paused"})
            where = f"{method.upper()} {url} ({page.name}): {response.status_code}"
            if response.status_code == 405 or response.status_code == 404 and client.get(url).status_code == 404:
                continue  # the view does not take this method, or there is no such page here
            accepted.append(where)
            if page.admin and not (method == "post" and page.name.endswith(WRITE_ADMIN_VIEWS)):
                # The admin writes only on a POST to an add, change or delete page (or a changelist's action,
                # which a viewer is not offered); anything else it serves as a read: the snapshot below proves it.
                continue
            if page.name.startswith("api:"):
                ok = response.status_code in (401, 403)  # the API takes a token, never the session
            elif page.missing:
                ok = response.status_code in (302, 403)  # the admin sends to its index: no such row
            else:
                ok = response.status_code == 403
            if not ok:
                wrong.append(where)
    assert not wrong, "\n".join(wrong)
    assert any("notify-channel-add" in a for a in accepted) and any("step-approve" in a for a in accepted)
    for action in ("rotate", "test"):
        response = client.post(reverse("notify-channel-change", args=[hook.pk, action]))
        assert response.status_code == 403, action
    for changelist in ("admin:planning_plan_changelist", "admin:agents_agenttoken_changelist",
                       "admin:notifications_channel_changelist", "admin:auth_user_changelist"):
        response = client.post(reverse(changelist), {"action": "delete_selected", "_selected_action": [1, 2, 3],
                                                      "post": "yes"})
        assert response.status_code in (200, 302, 403), changelist
    assert snapshot() | {"channels": list(Channel.objects.order_by("pk").values())} == before
