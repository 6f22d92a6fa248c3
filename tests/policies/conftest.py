from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.cache import cache

from policies.services import STATE_CACHE_KEY
from tests.notifications.conftest import receiver  # noqa: F401  (the local webhook receiver, for policies that notify)


@pytest.fixture(autouse=True)
def budgets_cache_cleared() -> Iterator[None]:
    """Policies and budgets are cached for a few seconds; a test's policies and budgets must not outlive it (its rows are rolled back)."""
    cache.delete(STATE_CACHE_KEY)
    yield
    cache.delete(STATE_CACHE_KEY)
