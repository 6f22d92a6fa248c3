"""The SDK's in-memory exporter in place of an OTLP endpoint, and a lineage driven as an operator drives one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from planner_site import tracing
from tests.api.conftest import api, external_agent, raw_token, tooled  # noqa: F401 (the API's fixtures, reused)


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    """Export on, to memory, span by span; off again after the test."""
    from planning import trace_spans

    trace_spans._exported.clear()  # ids come again from test to test
    trace_spans._kinds.clear()
    exporter = InMemorySpanExporter()
    tracing.provider_install(exporter)
    yield exporter
    tracing.provider_install(None)
