"""`{% step_row step %}`: a plan's step row, the one HTML of a step on the plan page and in its live pushes
(`step_row_html`, which planning/live/renderers.py calls for the rows it pushes).

A row is built here (every value escaped) rather than by a template partial, as the dashboard's rows are
(dashboard_rows.py): the partial resolved ~40 variables and ran ~20 `{% if %}` a row, and was three quarters of
the CPU of a plan of 1,000 steps (`make bench`, plan_page_1000: 3.4x its bare template)."""

from __future__ import annotations

from html import escape as e

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import SafeString, mark_safe

from agents.persona import MAX_OVERRIDES
from planning.models import Plan, PlanStep, steps_shown_fingerprint
from planning.selectors import step_rollback_possible
from planning.templatetags.dashboard_rows import STEP_STATUS, label, short

register = template.Library()

SHOWN = 400  # characters of a step's result or error shown, as the template's truncatechars:400
OVERRIDES = (f'<span class="step-overrides" title="cycles in a row an urgent need overrode this step; {MAX_OVERRIDES} '
             f'in a row replan the plan">overrides in a row {{overrides}}/{MAX_OVERRIDES}</span>')
ASKING = (PlanStep.Status.PENDING, PlanStep.Status.AWAITING_APPROVAL)


def step_facts(step: PlanStep) -> str:
    """The row's second line: what the step does, what it expects and waits on, its counters, who approved it."""
    parts = []
    if step.tool:
        # The exact input, as approved: paths whole, written content previewed (planning/engine/shown.py).
        parts.append(f"tool <code>{e(step.tool)}</code> input <code>{e(step.input_preview)}</code>")
    elif step.action_hint:
        parts.append(f"action <code>{e(step.action_hint)}</code>")
    if step.expected_outcome:
        parts.append(f" · expects: {e(step.expected_outcome)}")
    if step.depends_on:
        parts.append(" · after " + ", ".join(f'<a href="#step-{e(str(d))}">{e(str(d))}</a>' for d in step.depends_on))
    loop = step.loop if isinstance(step.loop, dict) else {}
    if loop.get("for_each"):
        parts.append(f" · for each file listed by step {e(str(loop['for_each']))}")
    elif loop.get("repeat"):
        parts.append(f" · repeated {e(str(loop['repeat']))}×")
    tools = step.tools_needed or []
    if len(tools) > 1 or (tools and not step.tool):
        parts.append(" · tools needed: " + ", ".join(e(str(t)) for t in tools))
    parts.append(f"\n        · cycles {int(step.actual_cycles)}/{int(step.estimated_cycles)}")
    if not step.tool:
        parts.append(" · " + OVERRIDES.format(overrides=int(step.overrides)))
    if step.retries:
        parts.append(f" · retries {int(step.retries)}/{int(step.max_retries)}")
    if step.elapsed_ms is not None:
        parts.append(f" · took {int(step.elapsed_ms)} ms")
    if step.approved_by_id and step.approved_by:
        parts.append(f" · approved by {e(step.approved_by.get_username())}")
    return "".join(parts)


def step_decisions(step: PlanStep, *, policy_undo: int | None) -> str:
    """An operator's forms on the row of an active plan: approve or decline a waiting step, undo a policy's
    approval, edit or skip a step not started."""
    pk, key = int(step.pk), e(step.key)
    parts = []
    if step.status == PlanStep.Status.AWAITING_APPROVAL:
        parts.append(
            f'\n      <div class="decide">'
            f'\n        <form hx-post="{e(reverse("step-approve", args=[pk]))}" hx-swap="none" class="inline">'
            f'<input type="hidden" name="seen_steps" value="{e(steps_shown_fingerprint([step]))}">'
            f'<button class="primary">Approve</button></form>'
            f'\n        <form id="decline-form-{pk}" hx-post="{e(reverse("step-decline", args=[pk]))}" hx-swap="none" '
            f'class="inline decline">'
            f'\n          <label for="feedback-{pk}">Feedback</label>'
            f'\n          <input id="feedback-{pk}" name="feedback" required maxlength="2000" '
            f'placeholder="Why not? The agent replans with this.">'
            f'\n          <button class="danger">Decline</button>'
            f'\n        </form>'
            f'\n      </div>')
    if policy_undo:
        parts.append(
            f'\n      <div class="decide"><span class="small muted">Approved by a policy, not started yet.</span>'
            f'\n        <form id="policy-undo-form-{pk}" hx-post="{e(reverse("step-policy-undo", args=[pk]))}" '
            f'hx-swap="none" class="inline" hx-confirm="Undo the policy\'s approval of step {key}? It waits for a '
            f'person again."><input type="hidden" name="event" value="{e(str(policy_undo))}">'
            f'<button>Undo approval</button></form></div>')
    if step.status in ASKING:
        parts.append(
            f'\n      <div class="small step-tools"><a href="{e(reverse("step-edit", args=[pk]))}">Edit step</a>'
            f'\n        <form hx-post="{e(reverse("step-skip", args=[pk]))}" hx-swap="none" class="inline" '
            f'hx-confirm="Skip step {key}?"><button class="link-dark">Skip step</button></form></div>')
    return "".join(parts)


def step_row_html(step: PlanStep, *, plan: Plan | None, can_decide: bool, rollback: bool,
                  policy_undo: int | None = None) -> SafeString:
    """The step's row: its key, status and words, the tags that warn, what it does and its counters, its result
    or failure, and the forms of an operator (`can_decide`) when its plan is active. `rollback`: whether "Roll
    back" has something to undo (step_rollback_possible); `policy_undo`: the event of a policy's approval an
    operator may undo. Every value from the database is escaped (`e`, the escaping Django's `escape` does)."""
    status = e(step.status)
    head = [f'<span class="key">{e(step.key)}</span>',
            f'<span class="badge {status}">{e(label(STEP_STATUS, step.status))}</span>',
            f'<b class="desc">{e(step.description)}</b>']
    if step.risk == PlanStep.Risk.RISKY:
        head.append('<span class="tag warn">risky</span>')
    if step.requires_permission:
        head.append('<span class="tag warn">requires permission</span>')
    if step.carried_over:
        head.append('<span class="tag ok">kept from earlier version</span>')
    tail = []
    if step.start_after is not None and step.status == PlanStep.Status.PENDING and step.start_after > timezone.now():
        tail.append(f'<div class="small waiting step-hold">Approved by a policy: starts after '
                    f'{e(f"{timezone.localtime(step.start_after):%H:%M:%S}")}'
                    f'{" unless you undo the approval" if policy_undo else ""}.</div>')
    if step.precheck and step.status == PlanStep.Status.AWAITING_APPROVAL:
        tail.append(f'<div class="small precheck">Pre-check: {e(step.precheck)}</div>')
    if step.result:
        tail.append(f'<div class="result small">→ {e(short(step.result, SHOWN))}</div>')
    if step.error:
        tail.append(f'<div class="error small">✗ {e(short(step.error, SHOWN))}</div>')
    if step.failure_reason:
        tail.append(f'<div class="error small">{e(step.failure_reason)}</div>')
    decisions = ""
    if can_decide and plan is not None and plan.status == Plan.Status.ACTIVE:
        decisions = step_decisions(step, policy_undo=policy_undo)
    if can_decide and rollback:
        decisions += (f'\n      <form hx-post="{e(reverse("step-rollback", args=[int(step.pk)]))}" hx-swap="none" '
                      f'class="inline small" hx-confirm="Roll back step {e(step.key)}? Its file changes are undone.">'
                      f'<button class="link-dark">Roll back</button></form>')
    return mark_safe(  # noqa: S308 - each value escaped
        f'\n    <li id="step-{e(step.key)}" class="step status-{status}" data-status="{status}">'
        f'\n      <div class="step-head">\n        ' + "\n        ".join(head) + '\n      </div>'
        f'\n      <div class="small">\n        {step_facts(step)}\n      </div>'
        + "".join(f"\n      {t}" for t in tail) + decisions + '\n    </li>\n')


@register.filter
def shown_fingerprint(steps: list[PlanStep]) -> str:
    """`{{ steps|shown_fingerprint }}`: the fingerprint an approve form carries (planning/engine/shown.py)."""
    return steps_shown_fingerprint(steps)


@register.simple_tag(takes_context=True)
def step_row(context: template.Context, step: PlanStep) -> SafeString:
    """The page's row of a step: whether it may be rolled back, and the policy's approval an operator may undo
    (planning.selectors.policy_approvals_undoable), from the page's context."""
    plan = context.get("plan")
    can_decide = bool(context.get("can_decide"))
    rollback = can_decide and plan is not None and step_rollback_possible(step, agent_id=plan.agent_id)
    policy_undo = (context.get("policy_undo") or {}).get(step.pk) if can_decide else None
    return step_row_html(step, plan=plan, can_decide=can_decide, rollback=rollback, policy_undo=policy_undo)
