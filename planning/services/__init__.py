"""Every change to plans, steps, their events and the goals an operator gives, by operators, policies, the
runner, the planner and external agents: one transaction each, a PlanEvent, a push after commit.

One module per noun it writes:

    plans.py         a plan approved, cancelled, sent back, a question answered; completed or abandoned; the
                     open plans of finished goals closed
    steps.py         a step approved, declined, skipped, edited, rolled back; put up for approval, started, finished;
                     the steps an outside agent reports it took
    versions.py      a plan's versions: the planner's writes (started, attempts, accepted, asked, failed, retried)
                     and an operator's edit as version n+1, refused on a stale version
    cycles.py        persona cycles recorded, a pass's or one cycle's (a list of one): experiences, steps, plans,
                     events; the agents' own rows through agents/services.py
    agents.py        a tool agent created and files put into its workspace; an agent's status, a goal given to
                     it, what it waits for and its next automatic retry
    events.py        the PlanEvent each write records, pushed after commit
    audit.py         changes made in the Django admin (rows added, changed, deleted; roles), each recorded
    reported.py      plans and steps an agent reports itself over the API and MCP (import it as a module: its
                     `step_start` is the agent's request, idempotent by its id; the start itself is
                     steps.py `step_started`, the runner's too)
    errors.py        why a service refused
    transactions.py  the one transaction (retried on conflict) and the locks, in one order

The names in `__all__` are re-exported, so `from planning import services; services.step_approve(...)` works.
"""

from __future__ import annotations

from planning.services.agents import (
    Upload,
    agent_create,
    agent_give_goal,
    agent_retry_earliest,
    agent_retry_sync,
    agent_set_status,
    agent_waiting_set,
    size_shown,
    workspace_upload,
)
from planning.services.errors import (
    DecisionError,
    GoalAlreadyPlanned,
    PlanAlreadyReplanned,
    PlanEditInvalid,
    PlanNoLongerValidating,
    PlanNotAwaitingApproval,
    StaleVersion,
    StepNotAwaitingApproval,
)
from planning.services.events import (
    REASON_MAX_LENGTH,
    actor_name,
    event_agent_record,
    event_record,
    reason_clean,
)
from planning.services.plans import (
    PLAN_FINAL,
    plan_abandon,
    plan_accept_done,
    plan_approve,
    plan_cancel,
    plan_clarify,
    plan_complete,
    plan_replan_request,
    plan_replan_schedule,
)
from planning.services.steps import (
    EDITABLE_STEP_FIELDS,
    STEP_JSON_FIELDS,
    STEP_TEXT_LIMITS,
    UNSTARTED,
    StepReport,
    step_approve,
    step_changes_problems,
    step_decline,
    step_edit,
    step_elapsed_ms,
    step_finish,
    step_move,
    step_outcome_unknown,
    step_rollback,
    step_skip,
    step_start,
    steps_reported,
    steps_request_approval,
)
from planning.services.transactions import (
    CONFLICT_ATTEMPTS,
    RETRYABLE_SQLSTATES,
    atomic_retried,
    conflict_retryable,
    plan_lock,
    step_lock,
)
from planning.services.versions import (
    EDITABLE_PLAN_STATUSES,
    REJECTED_OUTPUT_SHOWN,
    ROUTINE_FINE_ABOVE,
    Acceptance,
    Routine,
    attempt_reject,
    failure_reasons,
    plan_accept,
    plan_ask,
    plan_check_seen,
    plan_edit_save,
    plan_fail,
    plan_latest,
    plan_locked_validating,
    plan_repeat,
    plan_restatement_save,
    plan_retry_start,
    plan_start,
    plan_start_by_policy,
    plan_steps_build,
    plans_accept,
    plans_create,
    plans_first_start,
    routines_start,
    steps_permission_raise,
)

__all__ = [
    "Acceptance",
    "CONFLICT_ATTEMPTS",
    "DecisionError",
    "GoalAlreadyPlanned",
    "EDITABLE_PLAN_STATUSES",
    "EDITABLE_STEP_FIELDS",
    "PLAN_FINAL",
    "PlanAlreadyReplanned",
    "PlanEditInvalid",
    "PlanNoLongerValidating",
    "PlanNotAwaitingApproval",
    "REASON_MAX_LENGTH",
    "REJECTED_OUTPUT_SHOWN",
    "RETRYABLE_SQLSTATES",
    "STEP_JSON_FIELDS",
    "STEP_TEXT_LIMITS",
    "StaleVersion",
    "StepNotAwaitingApproval",
    "StepReport",
    "UNSTARTED",
    "Upload",
    "actor_name",
    "agent_create",
    "agent_give_goal",
    "agent_retry_earliest",
    "agent_retry_sync",
    "agent_set_status",
    "agent_waiting_set",
    "atomic_retried",
    "attempt_reject",
    "conflict_retryable",
    "event_agent_record",
    "event_record",
    "failure_reasons",
    "plan_abandon",
    "plan_accept_done",
    "plan_accept",
    "plan_approve",
    "plan_ask",
    "plan_cancel",
    "plan_check_seen",
    "plan_clarify",
    "plan_complete",
    "plan_edit_save",
    "plan_fail",
    "plan_latest",
    "plan_lock",
    "plan_locked_validating",
    "plan_replan_request",
    "plan_replan_schedule",
    "plan_restatement_save",
    "plan_retry_start",
    "plan_start",
    "plan_start_by_policy",
    "plan_steps_build",
    "plans_accept",
    "plans_create",
    "plans_first_start",
    "plan_repeat",
    "routines_start",
    "Routine",
    "ROUTINE_FINE_ABOVE",
    "reason_clean",
    "step_approve",
    "step_changes_problems",
    "step_decline",
    "step_edit",
    "step_elapsed_ms",
    "step_finish",
    "step_outcome_unknown",
    "step_lock",
    "step_move",
    "steps_reported",
    "steps_request_approval",
    "step_rollback",
    "step_skip",
    "step_start",
    "size_shown",
    "workspace_upload",
    "steps_permission_raise",
]
