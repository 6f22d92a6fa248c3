"""The confirmation page of an e-mail's Approve and Decline links: GET shows the exact steps and one button (a
GET never decides: mail scanners and link previews open links); POST decides, as the signed-in user, with the
role the server checks."""

from __future__ import annotations

import json
from typing import cast

from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from notifications.confirm import ConfirmRefused, ConfirmTarget, confirm_check, confirm_decide, confirm_read
from notifications.links import LinkExpired, LinkInvalid
from planner_site.roles import user_can_decide
from planning import services as planning


def page(request: HttpRequest, target: ConfirmTarget, token: str, *, refusal: str = "", done: str = "",
         status: int = 200, feedback: str = "") -> HttpResponse:
    steps = [target.step] if target.step is not None else list(target.plan.steps.all())
    shown = [(s, json.dumps(s.tool_input, ensure_ascii=False, indent=2, sort_keys=True)) for s in steps]
    # The one button stays while the decision is still to make: not after it, not when the link cannot decide.
    show_form = not done and (not refusal or status == 400)
    return render(request, "notifications/confirm.html", {
        "target": target, "plan": target.plan, "steps": shown, "token": token, "refusal": refusal, "done": done,
        "feedback": feedback, "show_form": show_form, "can_decide_here": user_can_decide(request.user),
    }, status=status)


@require_http_methods(["GET", "POST"])
def confirm_view(request: HttpRequest, token: str) -> HttpResponse:
    try:
        target = confirm_read(token)
    except LinkExpired:
        return render(request, "notifications/link_refused.html", {"expired": True}, status=410)
    except LinkInvalid:
        return render(request, "notifications/link_refused.html", {"expired": False}, status=400)
    if request.method == "GET":
        try:
            confirm_check(target)
        except ConfirmRefused as exc:
            return page(request, target, token, refusal=str(exc), status=409)
        return page(request, target, token)
    user = cast(User, request.user)  # LoginRequiredMiddleware: signed in
    if not user_can_decide(user):
        return page(request, target, token, status=403, refusal=f"Your account {user.get_username()} may only view; "
                                                                 "it cannot decide. Nothing was changed.")
    feedback = str(request.POST.get("feedback", "")).strip()
    if target.action == "decline" and not feedback:
        return page(request, target, token, status=400,
                    refusal="Feedback is required to decline: say what the agent should do instead. Nothing was changed.")
    try:
        confirm_decide(target, user=user, feedback=feedback)
    except (ConfirmRefused, planning.DecisionError) as exc:
        return page(request, target, token, refusal=str(exc), status=409, feedback=feedback)
    what = f"step {target.step.key}" if target.step else f"plan “{target.plan.goal_text}” (v{target.plan.version})"
    done = (f"Approved {what}." if target.action == "approve"
            else f"Declined {what}; the agent replans with your feedback.")
    return page(request, target, token, done=done)
