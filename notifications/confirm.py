"""E-mail that confirms: an e-mail's Approve and Decline links open a confirmation page with the exact steps and
one button. A link is signed by this site, expires after NOTIFY_LINK_MAX_AGE_SECONDS, decides once (its nonce is
marked used in the decision's own transaction), and is bound to the item as it was when the e-mail was made (a
fingerprint of the plan's version and its steps' tools and inputs): a changed plan is refused. The link only
finds the item: the reader signs in, and the server checks their role, as on every page."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import User
from django.core import signing
from django.db import IntegrityError, transaction
from django.urls import reverse

from notifications.deciding import item_decide, item_fingerprint, item_outcome, item_waiting
from notifications.links import LinkInvalid, token_load
from notifications.models import ConfirmLinkUse
from planning.models import Plan, PlanStep
from planning.services.transactions import plan_lock

SALT = "notifications.confirm"
ACTIONS = ("approve", "decline")
CHANGED = "The plan changed since this e-mail was sent. Nothing was changed."


class ConfirmRefused(Exception):
    """The link cannot decide (used, decided elsewhere, the plan changed); the message says why."""


def confirm_link_make(*, plan: Plan, step: PlanStep | None, action: str) -> str:
    token = signing.dumps({"p": plan.pk, "s": step.pk if step else None, "do": action,
                           "f": item_fingerprint(plan, step), "n": secrets.token_urlsafe(16)},
                          salt=SALT, compress=True)
    return settings.PLANNER_BASE_URL + reverse("notify-confirm", args=[token])


@dataclass
class ConfirmTarget:
    plan: Plan
    step: PlanStep | None
    action: str
    fingerprint: str
    nonce: str

    @property
    def kind(self) -> str:
        return "step" if self.step is not None else "plan"


def confirm_read(token: str) -> ConfirmTarget:
    """The item a token points at; LinkExpired, or LinkInvalid (altered, not this site's, the item deleted)."""
    data = token_load(token, salt=SALT)
    if not isinstance(data, dict) or data.get("do") not in ACTIONS or not isinstance(data.get("p"), int) \
            or not isinstance(data.get("n"), str) or not isinstance(data.get("f"), str):
        raise LinkInvalid("not a link of this site")
    plan = Plan.objects.select_related("agent").filter(pk=data["p"]).first()
    step = PlanStep.objects.select_related("plan").filter(pk=data["s"], plan_id=data["p"]).first() \
        if isinstance(data.get("s"), int) else None
    if plan is None or (data.get("s") is not None and step is None):
        raise LinkInvalid("what the link pointed at no longer exists")
    return ConfirmTarget(plan=plan, step=step, action=data["do"], fingerprint=data["f"], nonce=data["n"])


def confirm_check(target: ConfirmTarget) -> None:
    """Why this link cannot decide now, or nothing."""
    used = ConfirmLinkUse.objects.select_related("user").filter(nonce=target.nonce).first()
    if used is not None:
        who = used.user.get_username() if used.user else "someone"
        raise ConfirmRefused(f"This link was already used, by {who} at {used.used_at:%H:%M UTC, %-d %b %Y}. "
                             "Nothing was changed.")
    if not item_waiting(target.kind, target.plan, target.step):
        outcome = item_outcome(target.kind, target.plan.pk, target.step.pk if target.step else None)
        raise ConfirmRefused(f"Already decided: {outcome} Nothing was changed.")
    if item_fingerprint(target.plan, target.step) != target.fingerprint:
        raise ConfirmRefused(CHANGED)


@transaction.atomic
def confirm_decide(target: ConfirmTarget, *, user: User, feedback: str = "") -> None:
    """Decide through the planning services, and mark the link used, in one transaction (a refusal marks nothing)."""
    plan = plan_lock(target.plan.pk)  # two clicks of one link: one at a time
    target.plan = plan
    if target.step is not None:
        target.step.refresh_from_db()
    confirm_check(target)
    try:
        with transaction.atomic():
            ConfirmLinkUse.objects.create(nonce=target.nonce, user=user, action=target.action)
    except IntegrityError as exc:
        raise ConfirmRefused("This link was already used. Nothing was changed.") from exc
    item_decide(kind=target.kind, plan=plan, step=target.step, user=user, action=target.action, text=feedback,
                via="email")
