"""Nothing an operator decides is lost to a runner writing at the same time: a persona cycle that read its
step before an operator cancelled the plan does not bring the step (or the plan) back. And nothing the runner
wrote is lost to an admin form loaded before it: a save writes only what the operator changed, refuses a field
someone changed meanwhile, and an unchanged save changes and records nothing."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

import runtime.cycle as cycle
from agents.models import Agent, Need
from goals.models import Goal
from planning import services
from planning.models import Plan, PlanEvent, PlanStep
from runtime.cycle import agent_cycle
from tests.agents.test_cycle import hungry_persona
from tests.factories import AgentFactory, GoalFactory, NeedFactory, PlanFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_a_cancel_during_a_persona_cycle_is_not_overwritten(operator: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = hungry_persona()
    agent_cycle(agent_id=agent.pk, runner="runner-test")  # plans, and starts the first step
    plan = Plan.objects.get(agent=agent)
    real_apply = cycle.action_apply

    def apply_while_operator_cancels(action: str, needs: Any) -> Any:
        services.plan_cancel(plan=plan, user=operator, reason="not this plan")  # between the read and the write
        return real_apply(action, needs)

    monkeypatch.setattr(cycle, "action_apply", apply_while_operator_cancels)
    agent_cycle(agent_id=agent.pk, runner="runner-test")
    plan.refresh_from_db()
    assert plan.status == Plan.Status.CANCELLED
    unfinished = plan.steps.exclude(status__in=[PlanStep.Status.COMPLETED, PlanStep.Status.SKIPPED,
                                                PlanStep.Status.FAILED, PlanStep.Status.DECLINED,
                                                PlanStep.Status.CANCELLED])
    assert not unfinished.exists(), list(unfinished.values_list("key", "status"))
    cancelled_at = PlanEvent.objects.get(plan=plan, kind=PlanEvent.Kind.PLAN_CANCELLED).pk
    after = PlanEvent.objects.filter(plan=plan, pk__gt=cancelled_at).values_list("kind", flat=True)
    assert not set(after) & {PlanEvent.Kind.STEP_STARTED, PlanEvent.Kind.STEP_COMPLETED, PlanEvent.Kind.PLAN_COMPLETED}


# --- the Django admin: a form loaded before the runner wrote ----------------------------------------------------


class FormFields(HTMLParser):
    """What a browser posts for the page's change form: every input, select and textarea as rendered."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, str] = {}
        self.select: str | None = None
        self.textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        name = a.get("name")
        if tag == "input" and name and a.get("type") not in ("submit", "button"):
            if a.get("type") != "checkbox" or "checked" in a:
                self.data[name] = a.get("value") or ("on" if a.get("type") == "checkbox" else "")
        elif tag == "select" and name:
            self.select = name
            self.data.setdefault(name, "")
        elif tag == "option" and self.select and "selected" in a:
            self.data[self.select] = a.get("value") or ""
        elif tag == "textarea" and name:
            self.textarea = name
            self.data[name] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self.select = None
        elif tag == "textarea":
            self.textarea = None

    def handle_data(self, data: str) -> None:
        if self.textarea:
            self.data[self.textarea] += data.removeprefix("\n") if not self.data[self.textarea] else data


@pytest.fixture
def admin_client() -> Client:
    client = Client()
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


def admin_form(client: Client, url: str) -> dict[str, str]:
    """The change form as loaded now, to be posted later (the way an operator's browser tab holds it)."""
    page = client.get(url)
    assert page.status_code == 200
    parser = FormFields()
    parser.feed(page.content.decode())
    return {k: v for k, v in parser.data.items() if k != "csrfmiddlewaretoken" and "__prefix__" not in k}


def jenbina() -> Agent:
    agent = AgentFactory(name="Jenbina", waiting_reason="")
    NeedFactory(agent=agent, name="hunger", satisfaction=0.146)
    PlanFactory(agent=agent)  # the admin's event goes on her open plan
    return agent


def test_admin_stale_agent_form_keeps_what_the_runner_wrote(admin_client: Client) -> None:
    agent = jenbina()
    url = reverse("admin:agents_agent_change", args=[agent.pk])
    data = admin_form(admin_client, url)
    # The runner moves on while the form is open: she ate, a step waits for a person, cycles went by.
    Need.objects.filter(agent=agent, name="hunger").update(satisfaction=0.28)
    Agent.objects.filter(pk=agent.pk).update(waiting_reason="step 2 awaits approval", cycle_count=7,
                                             emotions={"content": 0.6})
    data["escalate_after_minutes"] = "15"
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    agent.refresh_from_db()
    assert agent.escalate_after_minutes == 15
    assert (agent.waiting_reason, agent.cycle_count, agent.emotions) == ("step 2 awaits approval", 7, {"content": 0.6})
    assert Need.objects.get(agent=agent, name="hunger").satisfaction == 0.28
    event = PlanEvent.objects.get(kind=PlanEvent.Kind.ADMIN_EDIT)
    assert event.actor_label == "root" and event.reason == "agent 'Jenbina' changed in admin"
    assert event.detail["diff"] == {"escalate_after_minutes": ["None", "15"]}  # what the operator changed, only


def test_admin_unchanged_save_changes_and_records_nothing(admin_client: Client) -> None:
    agent = jenbina()
    goal = GoalFactory(agent=agent, description="Get something to eat", confidence=0.9)
    for url in (reverse("admin:agents_agent_change", args=[agent.pk]), reverse("admin:goals_goal_change", args=[goal.pk])):
        data = admin_form(admin_client, url)
        Need.objects.filter(agent=agent).update(satisfaction=0.5)
        Goal.objects.filter(pk=goal.pk).update(confidence=0.7, status=Goal.Status.ABANDONED)
        assert admin_client.post(url, data).status_code == 302
    assert Need.objects.get(agent=agent).satisfaction == 0.5
    goal.refresh_from_db()
    assert (goal.confidence, goal.status) == (0.7, Goal.Status.ABANDONED)
    assert not PlanEvent.objects.filter(kind=PlanEvent.Kind.ADMIN_EDIT).exists()
    assert not LogEntry.objects.exists()


def test_admin_change_of_a_field_someone_changed_meanwhile_is_refused(admin_client: Client, operator: Any) -> None:
    agent = jenbina()
    url = reverse("admin:agents_agent_change", args=[agent.pk])
    data = admin_form(admin_client, url)
    services.agent_set_status(agent=agent, user=operator, status=Agent.Status.PAUSED)  # another operator, meanwhile
    Need.objects.filter(agent=agent).update(satisfaction=0.28)  # and the runner
    need = Need.objects.get(agent=agent)
    data |= {"status": Agent.Status.STOPPED, "backstory": "Changed too", "needs-0-satisfaction": "0.9"}
    response = admin_client.post(url, data)
    assert response.status_code == 200  # the form again, saying why
    html = response.content.decode()
    assert "Status was changed by someone else since you opened this form (it is now paused)" in html
    assert "Satisfaction was changed by someone else since you opened this form (it is now 0.28)" in html
    assert "Nothing was saved." in html
    agent.refresh_from_db()
    need.refresh_from_db()
    assert (agent.status, agent.backstory, need.satisfaction) == (Agent.Status.PAUSED, "A test agent.", 0.28)
    assert not PlanEvent.objects.filter(kind=PlanEvent.Kind.ADMIN_EDIT).exists()


def test_admin_change_of_a_field_nobody_else_touched_is_saved(admin_client: Client) -> None:
    agent = jenbina()
    url = reverse("admin:agents_agent_change", args=[agent.pk])
    data = admin_form(admin_client, url)
    Agent.objects.filter(pk=agent.pk).update(cycle_count=3)  # the runner, on a field the operator left alone
    data |= {"needs-0-satisfaction": "0.9", "status": Agent.Status.PAUSED}
    assert admin_client.post(url, data).status_code == 302
    agent.refresh_from_db()
    assert (agent.status, agent.cycle_count) == (Agent.Status.PAUSED, 3)
    assert Need.objects.get(agent=agent).satisfaction == 0.9
    kinds = {e.reason for e in PlanEvent.objects.filter(kind=PlanEvent.Kind.ADMIN_EDIT)}
    assert kinds == {"agent 'Jenbina' changed in admin", "needs of 'Jenbina' changed in admin"}


def test_admin_shows_runner_fields_read_only(admin_client: Client) -> None:
    agent = jenbina()
    goal = GoalFactory(agent=agent)
    agent_form = admin_form(admin_client, reverse("admin:agents_agent_change", args=[agent.pk]))
    goal_form = admin_form(admin_client, reverse("admin:goals_goal_change", args=[goal.pk]))
    assert not {"waiting_reason", "cycle_count", "next_cycle_at", "emotions"} & set(agent_form)
    assert not {"progress", "confidence", "times_advanced", "times_regressed"} & set(goal_form)


def test_admin_stale_plan_form_keeps_the_steps_the_runner_moved_on(admin_client: Client) -> None:
    plan = PlanFactory(agent=AgentFactory(kind="tool"), thinking_summary="Read, then convert.")
    step = plan.steps.create(key="1", position=1, description="Read data.csv", tool="file.read",
                             tool_input={"path": "data.csv"})
    url = reverse("admin:planning_plan_change", args=[plan.pk])
    data = admin_form(admin_client, url)
    # The runner starts the step while the form is open.
    PlanStep.objects.filter(pk=step.pk).update(status=PlanStep.Status.RUNNING, actual_cycles=1)
    data["thinking_summary"] = "Read it first."
    assert admin_client.post(url, data).status_code == 302
    plan.refresh_from_db()
    step.refresh_from_db()
    assert plan.thinking_summary == "Read it first."
    assert (step.status, step.actual_cycles) == (PlanStep.Status.RUNNING, 1)
    event = PlanEvent.objects.get(kind=PlanEvent.Kind.ADMIN_EDIT)
    assert list(event.detail["diff"]) == ["thinking_summary"]

    data = admin_form(admin_client, url)  # an operator skips the step from a form loaded before it completed
    PlanStep.objects.filter(pk=step.pk).update(status=PlanStep.Status.COMPLETED)
    data["steps-0-status"] = PlanStep.Status.SKIPPED
    response = admin_client.post(url, data)
    assert "Status was changed by someone else since you opened this form (it is now completed)" in \
        response.content.decode()
    step.refresh_from_db()
    assert step.status == PlanStep.Status.COMPLETED
