from __future__ import annotations

from collections.abc import Iterator

import pytest

from policies.services import policy_state_drop
from tests.notifications.conftest import receiver  # noqa: F401  (the local webhook receiver, for policies that notify)


@pytest.fixture(autouse=True)
def budgets_cache_cleared() -> Iterator[None]:
    """Policies and budgets are kept in the process for a few seconds; a test's policies and budgets must not
    outlive it (its rows are rolled back)."""
    policy_state_drop()
    yield
    policy_state_drop()
