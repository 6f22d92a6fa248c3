"""The notification settings page (each operator edits only their own channels and subscriptions) and the
signed deep links that notifications carry."""

from __future__ import annotations

from typing import Any, cast

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from notifications import selectors, services
from notifications.forms import ChannelForm, SubscriptionForm
from notifications.links import LinkExpired, LinkInvalid, link_read
from notifications.models import Channel
from planner_site.roles import user_can_decide
from planning.models import Plan, PlanStep

CHANNEL_ACTIONS = ("on", "off", "remove", "rotate", "test")
VIEWER_REFUSED = ("Only operators add or change webhook and Slack channels; a viewer may be told by e-mail at their "
                  "own account's address. Nothing was changed.")


def owner(request: HttpRequest) -> User:
    return cast(User, request.user)  # LoginRequiredMiddleware: every view here has a signed-in user


def settings_context(request: HttpRequest, **extra: Any) -> dict[str, Any]:
    user = owner(request)
    subscriptions = list(selectors.subscriptions_of(user.pk))
    return {
        "channels": list(selectors.channels_of(user.pk)),
        "subscriptions": [(s, SubscriptionForm(prefix=f"s{s.pk}", initial={
            "kinds": s.kinds, "agents": list(s.agents.all()), "min_risk": s.min_risk,
            "remind_after_minutes": s.remind_after_minutes, "escalate_after_minutes": s.escalate_after_minutes,
            "escalate_to": s.escalate_to_id})) for s in subscriptions],
        "channel_form": ChannelForm(),
        "subscription_form": SubscriptionForm(prefix="new"),
        "recent": selectors.notifications_recent(user.pk),
        "kinds": dict(Channel.Kind.choices),
        **slack_context(request),
        **extra,
    }


def slack_context(request: HttpRequest) -> dict[str, Any]:
    from notifications.forms_slack import SlackAppChannelForm
    from notifications.models import SlackAccount

    return {"slack_form": SlackAppChannelForm(prefix="slack"), "slack_accounts": list(SlackAccount.objects.filter(user=owner(request))),
            "slack_interactivity_url": settings.PLANNER_BASE_URL + reverse("notify-slack-interactions")}


def settings_answer(request: HttpRequest, note: str, *, ok: bool, status: int = 200, **extra: Any) -> HttpResponse:
    """The refreshed settings panel for htmx, or the page again after a redirect for a plain form (a refusal of
    the role or of a missing channel: the page itself, with its status)."""
    if status in (403, 404) and not getattr(request, "htmx", False):
        context = settings_context(request, flash=[("error", note)], **extra)
        return render(request, "notifications/settings.html", context, status=status)
    if getattr(request, "htmx", False):
        context = settings_context(request, flash=[("success" if ok else "error", note)], **extra)
        return render(request, "notifications/settings.html#panel", context, status=status)
    (messages.success if ok else messages.error)(request, note)
    return redirect("notify-settings")


@require_GET
def settings_page(request: HttpRequest) -> HttpResponse:
    return render(request, "notifications/settings.html", settings_context(request))


@require_POST
def channel_add_view(request: HttpRequest) -> HttpResponse:
    if not user_can_decide(owner(request)) and request.POST.get("kind") != Channel.Kind.EMAIL:
        return settings_answer(request, VIEWER_REFUSED, ok=False, status=403)
    form = ChannelForm(request.POST)
    if not form.is_valid():
        errors = " ".join(str(e) for errs in form.errors.values() for e in errs)
        return settings_answer(request, f"{errors} Nothing was changed.", ok=False, status=400, channel_form=form)
    try:
        channel = services.channel_add(user=owner(request), **form.cleaned_data)
    except services.SettingsForbidden as exc:
        return settings_answer(request, str(exc), ok=False, status=403)
    except services.SettingsError as exc:
        return settings_answer(request, str(exc), ok=False, status=409)
    return settings_answer(request, f"Added {channel}.", ok=True)


@require_POST
def channel_change_view(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    user = owner(request)
    if action not in CHANNEL_ACTIONS:
        return settings_answer(request, "Unknown change of a channel. Nothing was changed.", ok=False, status=404)
    try:
        if action == "remove":
            services.channel_remove(user=user, channel_id=pk)
            return settings_answer(request, "Channel removed.", ok=True)
        if action == "rotate":
            services.channel_secret_rotate(user=user, channel_id=pk)
            return settings_answer(request, "New secret made: update your receiver.", ok=True)
        if action == "test":
            result = services.channel_test(user=user, channel_id=pk)
            if result.ok:
                return settings_answer(request, f"Test sent{f' (HTTP {result.status_code})' if result.status_code else ''}.",
                                       ok=True)
            return settings_answer(request, f"Test not delivered: {result.error}.", ok=False)
        channel = services.channel_set_active(user=user, channel_id=pk, active=action == "on")
    except services.SettingsForbidden as exc:
        return settings_answer(request, str(exc), ok=False, status=403)
    except services.SettingsError as exc:
        return settings_answer(request, str(exc), ok=False, status=404)
    return settings_answer(request, f"{channel} is {'on' if channel.active else 'off'}.", ok=True)


@require_POST
def subscription_save_view(request: HttpRequest, pk: int | None = None) -> HttpResponse:
    form = SubscriptionForm(request.POST, prefix="new" if pk is None else f"s{pk}")
    if not form.is_valid():
        errors = " ".join(str(e) for errs in form.errors.values() for e in errs)
        return settings_answer(request, f"{errors} Nothing was changed.", ok=False, status=400)
    try:
        services.subscription_save(user=owner(request), subscription_id=pk, kinds=form.cleaned_data["kinds"],
                                   agents=form.cleaned_data["agents"], min_risk=form.cleaned_data["min_risk"],
                                   remind_after_minutes=form.cleaned_data.get("remind_after_minutes"),
                                   escalate_after_minutes=form.cleaned_data.get("escalate_after_minutes"),
                                   escalate_to=form.cleaned_data.get("escalate_to"))
    except services.SettingsError as exc:
        return settings_answer(request, str(exc), ok=False, status=404 if pk else 400)
    return settings_answer(request, "Subscription saved." if pk else "Subscribed.", ok=True)


@require_POST
def subscription_remove_view(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        services.subscription_remove(user=owner(request), subscription_id=pk)
    except services.SettingsError as exc:
        return settings_answer(request, str(exc), ok=False, status=404)
    return settings_answer(request, "Subscription removed.", ok=True)


@require_GET
def link_open(request: HttpRequest, token: str) -> HttpResponse:
    """A notification's deep link: to the item, once the reader is signed in. A link never decides anything by
    itself (a GET, forwarded or prefetched by a chat app); Approve and Decline land on the item's buttons."""
    try:
        target = link_read(token)
    except LinkExpired:
        return render(request, "notifications/link_refused.html", {"expired": True}, status=410)
    except LinkInvalid:
        return render(request, "notifications/link_refused.html", {"expired": False}, status=400)
    if target.step_id is not None:
        step = get_object_or_404(PlanStep.objects.select_related("plan"), pk=target.step_id)
        if target.action == "undo":
            messages.info(request, f"A policy approved step {step.key}; undo the approval with its button below "
                                   "before the step starts.")
        elif target.action != "open":
            messages.info(request, f"{'Approve' if target.action == 'approve' else 'Decline'} step {step.key} "
                                   f"with its button below{' (feedback is required)' if target.action == 'decline' else ''}.")
        return redirect(step.plan.get_absolute_url() + f"#step-{step.key}")
    if target.plan_id is not None:
        plan = get_object_or_404(Plan, pk=target.plan_id)
        if target.action != "open":
            messages.info(request, f"{'Approve' if target.action == 'approve' else 'Cancel'} the plan with its "
                                   "buttons below.")
        return redirect(plan.get_absolute_url())
    if target.agent_id is not None:
        return redirect(reverse("agent-detail", args=[target.agent_id]))
    return redirect("inbox")
