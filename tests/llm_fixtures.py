"""The scripted OpenAI-compatible server as a fixture, for the gateway and planner tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pytest_django.fixtures import Settings

from tests.llm_server import LLMTestServer


@pytest.fixture
def llm_server(settings: Settings) -> Iterator[LLMTestServer]:
    """A scripted OpenAI-compatible server; settings point the provider at it, with short timeouts."""
    with LLMTestServer() as server:
        settings.OPENAI_BASE_URL = server.base_url
        settings.OPENAI_API_KEY = "test-key"
        # Short enough that a scripted hang costs about a second, and one retry shows the SDK retrying.
        settings.LLM_TIMEOUT_SECONDS = 0.5
        settings.LLM_MAX_RETRIES = 1
        yield server
