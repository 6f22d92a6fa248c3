"""What the domain tells the runtime, which it never imports (tests/test_layers.py): the runtimes connect here."""

from __future__ import annotations

import functools

from django.db import transaction
from django.dispatch import Signal

# An operator's write about an agent committed: a decision in the inbox or on a plan page, an edit, a goal
# given, a resume, a change in the admin, a call of the API (every event with a user as its actor); and a remote
# A2A agent's push notification that changed its task (its plan may have ended). Sent with `agent_id`, after the
# commit. The runtimes bring the agent's next cycle forward: the decision takes effect now,
# not after the rest of the agent's cycle interval.
operator_acted = Signal()


def operator_acted_on_commit(agent_id: int) -> None:
    """Send `operator_acted` for the agent once the transaction commits (at once outside one; never on a
    rollback). A receiver's error is logged, not raised into the operator's request: the agent still cycles
    at its interval."""
    transaction.on_commit(functools.partial(operator_acted.send_robust, sender=None, agent_id=agent_id))


# Events that may notify someone were written in bulk (bulk_create sends no post_save) and committed: the
# notifications runtime dispatches now rather than on its next sweep. Sent without arguments, after the commit.
events_may_notify = Signal()


def events_may_notify_on_commit() -> None:
    """Send `events_may_notify` once the transaction commits; a receiver's error is logged, not raised."""
    transaction.on_commit(functools.partial(events_may_notify.send_robust, sender=None))
