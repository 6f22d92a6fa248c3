"""Retention: old machine-written rows go, what operators did and what open plans show stays, every query
is set-based (the same count for 2 goals as for 40), and `manage.py prune` reports what it did."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agents.models import Experience, Lesson, LLMCall
from planning.models import Plan, PlanEvent
from runtime.retention import retention_prune
from tests.factories import (
    AgentFactory,
    ExperienceFactory,
    LessonFactory,
    LLMCallFactory,
    PlanEventFactory,
    PlanFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


def aged(model: Any, rows: list[Any], hours: float, field: str = "created_at") -> None:
    """Move rows back in time (their timestamps are set on insert)."""
    model.objects.filter(pk__in=[r.pk for r in rows]).update(**{field: timezone.now() - timedelta(hours=hours)})


@pytest.fixture
def windows(settings: Any) -> Any:
    settings.RETAIN_EXPERIENCES_HOURS = 24
    settings.RETAIN_LLM_BODIES_HOURS = 24
    settings.RETAIN_LLM_CALLS_HOURS = 168
    settings.RETAIN_EVENTS_HOURS = 168
    return settings


def test_old_experiences_go_recent_ones_stay_and_lessons_keep_their_text(windows: Any) -> None:
    agent = AgentFactory()
    old = ExperienceFactory.create_batch(3, agent=agent)
    recent = ExperienceFactory(agent=agent)
    lesson = LessonFactory(agent=agent, source_experience=old[0])
    aged(Experience, old, 25)
    report = retention_prune()
    assert report.counts["experiences"] == 3
    assert list(Experience.objects.values_list("pk", flat=True)) == [recent.pk]
    lesson.refresh_from_db()
    assert lesson.source_experience is None and Lesson.objects.filter(pk=lesson.pk).exists()


def test_model_call_bodies_are_cleared_first_and_the_rows_go_later(windows: Any) -> None:
    day_old, week_old, fresh = LLMCallFactory.create_batch(3, tokens_in=120, tokens_out=40)
    aged(LLMCall, [day_old], 30)
    aged(LLMCall, [week_old], 170)
    retention_prune()
    day_old.refresh_from_db()
    # The usage record stays (model, tokens), the text of the prompt and answer does not.
    assert (day_old.prompt, day_old.response, day_old.body_pruned) == ([], "", True)
    assert (day_old.model, day_old.tokens_in, day_old.tokens_out) == ("offline-rules", 120, 40)
    fresh.refresh_from_db()
    assert fresh.response and fresh.prompt and not fresh.body_pruned
    assert not LLMCall.objects.filter(pk=week_old.pk).exists()


def test_events_of_closed_plans_go_but_operators_and_open_plans_keep_theirs(windows: Any) -> None:
    operator = UserFactory()
    closed = PlanFactory(status=Plan.Status.COMPLETED)
    open_plan = PlanFactory(status=Plan.Status.ACTIVE)
    runner_event = PlanEventFactory(plan=closed, kind=PlanEvent.Kind.STEP_STARTED)
    decided = PlanEventFactory(plan=closed, kind=PlanEvent.Kind.STEP_DECLINED, actor=operator, actor_label="olga")
    still_open = PlanEventFactory(plan=open_plan, kind=PlanEvent.Kind.STEP_STARTED)
    recent = PlanEventFactory(plan=closed, kind=PlanEvent.Kind.PLAN_COMPLETED)
    aged(PlanEvent, [runner_event, decided, still_open], 200)
    retention_prune()
    assert set(PlanEvent.objects.values_list("pk", flat=True)) == {decided.pk, still_open.pk, recent.pk}


def test_zero_keeps_rows_forever(windows: Any) -> None:
    windows.RETAIN_EXPERIENCES_HOURS = 0
    windows.RETAIN_LLM_BODIES_HOURS = 0
    windows.RETAIN_LLM_CALLS_HOURS = 0
    experience = ExperienceFactory()
    call = LLMCallFactory()
    aged(Experience, [experience], 10_000)
    aged(LLMCall, [call], 10_000)
    assert retention_prune().total == 0
    call.refresh_from_db()
    assert call.response and Experience.objects.filter(pk=experience.pk).exists()


def test_backlog_goes_in_bounded_batches_with_a_query_count_independent_of_agents(windows: Any) -> None:
    def queries_for(agents: int) -> int:
        for agent in AgentFactory.create_batch(agents):
            aged(Experience, ExperienceFactory.create_batch(3, agent=agent), 30)
        with CaptureQueriesContext(connection) as captured:
            report = retention_prune(batch=1000)
        assert report.counts["experiences"] == agents * 3
        return len(captured)

    # (Django deletes in chunks of 100 rows; 30 agents stay within one, so only agents could add queries.)
    assert queries_for(2) == queries_for(30)


def test_batches_stop_at_the_budget_and_say_more_remains(windows: Any) -> None:
    agent = AgentFactory()
    aged(Experience, ExperienceFactory.create_batch(7, agent=agent), 30)
    report = retention_prune(batch=2, budget_seconds=0)
    assert report.more and report.counts["experiences"] == 2
    assert retention_prune(batch=2).counts["experiences"] == 5


def test_prune_command_reports_what_it_deleted(windows: Any) -> None:
    aged(Experience, ExperienceFactory.create_batch(2), 30)
    out = StringIO()
    call_command("prune", stdout=out)
    text = out.getvalue()
    assert "Keeping experiences 24 h" in text
    assert "experiences: 2 deleted" in text and "Pruned 2 rows." in text
    assert not Experience.objects.exists()


def test_prune_command_refuses_a_bad_batch() -> None:
    with pytest.raises(CommandError, match="at least 1. Nothing was changed."):
        call_command("prune", "--batch", "0")


def test_undo_copies_go_a_while_after_their_plan_closed(windows: Any, operator: Any) -> None:
    """An open plan's steps keep theirs (an operator may roll them back); a plan closed RETAIN_UNDO_HOURS ago
    loses them, and a rollback then says why; copies of a step that no longer exists go too."""
    from agents.tools import undo_dir_for
    from planning.models import PlanStep
    from planning.services import DecisionError, step_rollback
    from tests.factories import PlanStepFactory

    windows.RETAIN_UNDO_HOURS = 168
    agent = AgentFactory(kind="tool")
    steps = {name: PlanStepFactory(plan=PlanFactory(agent=agent, status=status), tool="file.write",
                                   status=PlanStep.Status.COMPLETED)
             for name, status in [("open", Plan.Status.ACTIVE), ("closed long ago", Plan.Status.COMPLETED),
                                  ("closed lately", Plan.Status.COMPLETED)]}
    aged(Plan, [steps["closed long ago"].plan, steps["open"].plan], 200, field="updated_at")
    folders = {name: undo_dir_for(agent.workspace, str(step.pk)) for name, step in steps.items()}
    folders["step gone"] = undo_dir_for(agent.workspace, "999999")
    for folder in folders.values():
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text('{"tool": "file.write", "entries": []}', encoding="utf-8")

    assert retention_prune().counts["undo copies"] == 2
    assert {name for name, folder in folders.items() if folder.exists()} == {"open", "closed lately"}
    with pytest.raises(DecisionError, match="RETAIN_UNDO_HOURS"):
        step_rollback(step=steps["closed long ago"], user=operator)
    windows.RETAIN_UNDO_HOURS = 0  # kept forever
    aged(Plan, [steps["closed lately"].plan], 10_000, field="updated_at")
    assert retention_prune().counts["undo copies"] == 0 and folders["closed lately"].exists()


def test_notifications_sent_or_failed_go_after_their_window_those_still_to_send_never(windows: Any) -> None:
    """A long-running install stays bounded: a notification whose every delivery is delivered or failed goes
    RETAIN_NOTIFICATIONS_HOURS after it was made, with its deliveries and their attempts; one with a delivery
    still pending or being sent stays, however old; a recent one stays; 0 keeps them all."""
    from notifications.models import Channel, Delivery, DeliveryAttempt, Notification

    windows.RETAIN_NOTIFICATIONS_HOURS = 720
    operator = UserFactory()
    hook = Channel.objects.create(user=operator, kind=Channel.Kind.WEBHOOK, target="http://127.0.0.1:9/hook")
    mail = Channel.objects.create(user=operator, kind=Channel.Kind.EMAIL, target="olga@example.com")
    S = Delivery.Status

    def notification(key: str, *statuses: str) -> Notification:
        made = Notification.objects.create(user=operator, key=key, kind="waiting", title=key)
        for channel, status in zip([hook, mail], statuses, strict=False):
            delivery = Delivery.objects.create(notification=made, channel=channel, status=status, attempts=1,
                                               next_attempt_at=timezone.now())
            DeliveryAttempt.objects.create(delivery=delivery, number=1, ok=status == S.DELIVERED)
        return made

    rows = {"delivered": notification("delivered", S.DELIVERED, S.DELIVERED),
            "failed": notification("failed", S.FAILED, S.DELIVERED),
            "no channel": notification("no channel"),
            "pending": notification("pending", S.DELIVERED, S.PENDING),
            "sending": notification("sending", S.SENDING)}
    aged(Notification, list(rows.values()), 721)
    rows["recent"] = notification("recent", S.DELIVERED)

    assert retention_prune().counts["notifications"] == 3
    assert set(Notification.objects.values_list("key", flat=True)) == {"pending", "sending", "recent"}
    assert set(Delivery.objects.values_list("notification__key", flat=True)) == {"pending", "sending", "recent"}
    assert DeliveryAttempt.objects.count() == 4  # pending's two, sending's and recent's

    windows.RETAIN_NOTIFICATIONS_HOURS = 0  # kept forever
    Delivery.objects.update(status=S.DELIVERED)
    aged(Notification, list(Notification.objects.all()), 10_000)
    assert retention_prune().counts["notifications"] == 0 and Notification.objects.count() == 3
    windows.RETAIN_NOTIFICATIONS_HOURS = 720
    assert retention_prune().counts["notifications"] == 3 and not Notification.objects.exists()
