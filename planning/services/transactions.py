"""The one transaction every service runs in, and the locks it takes.

A service is one transaction (`atomic_retried`: a deadlock or serialization failure between concurrent writers
is retried); its rows are locked in one order everywhere (the plan, then its steps, then the agent and goal
rows), so no two services can wait on each other.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable

from django.db import OperationalError, transaction

from planning.models import Plan, PlanStep

logger = logging.getLogger("planner.services")

# PostgreSQL's serialization failure and deadlock, SQLite's busy database: the transaction was rolled back
# as a whole and may simply run again.
RETRYABLE_SQLSTATES = {"40001", "40P01"}
CONFLICT_ATTEMPTS = 5


def conflict_retryable(exc: OperationalError) -> bool:
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) in RETRYABLE_SQLSTATES or "database is locked" in str(exc)


def atomic_retried[**P, R](func: Callable[P, R]) -> Callable[P, R]:
    """Run a service in one transaction; the rare deadlock or serialization failure between concurrent
    writers is retried with a short random backoff instead of reaching the user as a server error.

    Inside an outer transaction nothing can be retried here (the outer one was rolled back too), so the
    error goes up to whoever owns that transaction."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if not transaction.get_autocommit():  # inside an outer transaction
            with transaction.atomic():
                return func(*args, **kwargs)
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                with transaction.atomic():
                    return func(*args, **kwargs)
            except OperationalError as exc:
                if attempt == CONFLICT_ATTEMPTS or not conflict_retryable(exc):
                    raise
                logger.info("%s: %s; retrying (attempt %d)", func.__name__, exc, attempt + 1)
                time.sleep(random.uniform(0.005, 0.02 * 2 ** attempt))
        raise AssertionError("unreachable")

    return wrapper


# --- locks: one order everywhere (plan, then its steps, then the agent and goal rows), so no two services
# can wait on each other. FOR NO KEY UPDATE, because nothing here changes a primary key: inserting an event
# that points at a locked plan or step (a KEY SHARE lock) then never waits.


def plan_lock(pk: int) -> Plan:
    """The plan, locked for this transaction."""
    return Plan.objects.select_for_update(no_key=True).get(pk=pk)


def step_lock(pk: int) -> PlanStep:
    """The step, locked after its plan (the plan comes with it, as `step.plan`)."""
    plan_id = PlanStep.objects.values_list("plan_id", flat=True).get(pk=pk)
    plan = plan_lock(plan_id)
    step = PlanStep.objects.select_for_update(no_key=True).get(pk=pk)
    step.plan = plan
    return step
