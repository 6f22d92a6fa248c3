"""OpenTelemetry traces: the one place that talks to the OpenTelemetry SDK (docs/tracing.md).

Spans are made after the facts, from what the product already records (plan events, model calls, step
results), each with its own start and end time and a parent rebuilt from stored ids: a plan that waits an hour
for a person is still one trace, and no span is held open across the wait. This module knows nothing of plans:
it is handed `SpanFact`s (planning/trace_spans.py builds them) and exports them.

Export is off unless an OTLP endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT`, or the product's own
`TRACE_EXPORT_ENDPOINT`): then nothing is built and nothing is sent.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import re
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings

if TYPE_CHECKING:  # the SDK is imported on the first export only: with export off it costs nothing
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
SCOPE = "agent-planner"
AttrValue = str | bool | int | float


# --- ids and the caller's trace ---------------------------------------------------------------------------


def trace_id_new() -> str:
    """A W3C trace id (32 hex digits, never all zero)."""
    return f"{secrets.randbits(128) or 1:032x}"


def span_id_new() -> str:
    return f"{secrets.randbits(64) or 1:016x}"


def span_id_of(trace_id: str, key: str) -> str:
    """The span id of a fact of a trace: the same fact gets the same id on every export."""
    digest = hashlib.blake2b(f"{trace_id}/{key}".encode(), digest_size=8).hexdigest()
    return digest if int(digest, 16) else "0000000000000001"


def traceparent_parse(header: str | None) -> tuple[str, str] | None:
    """(trace id, span id) of a W3C `traceparent` header; None when absent or malformed (then ignored)."""
    match = TRACEPARENT.match((header or "").strip().lower())
    if match is None or match[1] == "0" * 32 or match[2] == "0" * 16:
        return None
    return match[1], match[2]


def traceparent_format(trace_id: str, span_id: str) -> str:
    return f"00-{trace_id}-{span_id}-01"


_caller: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("trace_caller", default=None)


@contextlib.contextmanager
def joined(traceparent: str | None) -> Iterator[None]:
    """Inside this block a plan lineage that starts joins the caller's trace (its W3C `traceparent`)."""
    token = _caller.set(traceparent_parse(traceparent))
    try:
        yield
    finally:
        _caller.reset(token)


def joined_call[T](traceparent: str | None, fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` called inside `joined(traceparent)` (for a call handed to another thread)."""
    def call(*args: Any, **kwargs: Any) -> T:
        with joined(traceparent):
            return fn(*args, **kwargs)
    return call


def lineage_trace_id() -> str:
    """The trace id of a plan lineage that starts now (a Plan's default): the caller's trace when it sent a
    traceparent, else a new one."""
    caller = _caller.get()
    return caller[0] if caller else trace_id_new()


def lineage_parent_id() -> str:
    """The caller's span the lineage's root span is a child of ("" without a traceparent)."""
    caller = _caller.get()
    return caller[1] if caller else ""


def trace_url(trace_id: str) -> str:
    """The trace in the operators' trace UI (TRACE_URL_TEMPLATE), or "" when none is set."""
    template = getattr(settings, "TRACE_URL_TEMPLATE", "")
    return template.replace("{trace_id}", trace_id) if template and trace_id else ""


def sampled(trace_id: str, ratio: float) -> bool:
    """Whether a trace is exported at this ratio: decided by its id (as TraceIdRatioBased), so every export of
    one trace decides alike."""
    if ratio >= 1:
        return True
    return ratio > 0 and int(trace_id[-16:], 16) < ratio * 2**64


def capture_content() -> bool:
    """Prompts and answers go on spans only when OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT says so."""
    return bool(getattr(settings, "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", False))


# --- the facts to export ------------------------------------------------------------------------------------


@dataclass
class SpanEvent:
    name: str
    at: datetime
    attributes: dict[str, AttrValue] = field(default_factory=dict)


@dataclass
class SpanFact:
    """One span as recorded facts give it: `key` names it within its trace (its id derives from it), `parent`
    is its parent's key ("" for the root)."""

    key: str
    name: str
    kind: str  # the timeline's row kind: agent, plan, chat, wait, tool
    start: datetime
    end: datetime
    parent: str = ""
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    error: str = ""  # a description when the span failed; a wait never does
    closed_by: int = 0  # the record that closed it (0: still open); each span is exported once, past its closer

    @property
    def seconds(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds())


# --- the provider -----------------------------------------------------------------------------------------


_next_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("next_ids", default=None)


def fact_ids() -> Any:
    """An IdGenerator whose next span takes the ids the facts chose (`_next_ids`), random ones otherwise."""
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class FactIds(IdGenerator):
        def generate_span_id(self) -> int:
            chosen = _next_ids.get()
            return chosen[1] if chosen else int(span_id_new(), 16)

        def generate_trace_id(self) -> int:
            chosen = _next_ids.get()
            return chosen[0] if chosen else int(trace_id_new(), 16)

    return FactIds()


class Exporting:
    """This process's provider, made on the first export; tests install their own (`provider_install`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.provider: TracerProvider | None = None
        self.tracer: Tracer | None = None
        self.tracer_of: TracerProvider | None = None  # the provider that made it

    def endpoint(self) -> str:
        return getattr(settings, "TRACE_EXPORT_ENDPOINT", "") or getattr(settings, "OTEL_EXPORTER_OTLP_ENDPOINT", "")

    def on(self) -> bool:
        return self.provider is not None or bool(self.endpoint())

    def provider_get(self) -> TracerProvider:
        with self.lock:
            if self.provider is None:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
                from opentelemetry.sdk.trace.export import BatchSpanProcessor

                endpoint = self.endpoint().rstrip("/")
                url = endpoint if endpoint.endswith("/v1/traces") else f"{endpoint}/v1/traces"
                self.provider = self.provider_new(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
            return self.provider

    def tracer_get(self) -> Tracer:
        """The provider's tracer, made once (the SDK makes a new one on each call)."""
        provider = self.provider_get()
        with self.lock:
            if self.tracer is None or self.tracer_of is not provider:
                self.tracer, self.tracer_of = provider.get_tracer(SCOPE), provider
            return self.tracer

    def provider_new(self, processor: SpanProcessor) -> TracerProvider:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        resource = Resource.create({"service.name": getattr(settings, "OTEL_SERVICE_NAME", "") or SCOPE})
        provider = TracerProvider(resource=resource, id_generator=fact_ids())
        provider.add_span_processor(processor)
        return provider


exporting = Exporting()


def export_on() -> bool:
    """Whether spans are exported at all (an endpoint is set): else the callers build nothing."""
    return exporting.on()


def provider_install(exporter: SpanExporter | None) -> None:
    """Export to `exporter` at once, span by span (tests: the SDK's InMemorySpanExporter); None: back to the
    settings' endpoint, made again on the next export."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    with exporting.lock:
        old, exporting.provider = exporting.provider, (
            exporting.provider_new(SimpleSpanProcessor(exporter)) if exporter is not None else None)
    if old is not None:
        old.shutdown()


def flush(timeout_ms: int = 5000) -> None:
    """Send what is batched (a short-lived process, or a test, before it looks at the receiver)."""
    if exporting.provider is not None:
        exporting.provider.force_flush(timeout_ms)


def ns(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000_000)


def spans_export(*, trace_id: str, root_id: str, parent_id: str, facts: Sequence[SpanFact]) -> int:
    """Export the facts of one trace as spans, parents first: the root (key "") takes `root_id` and is the
    child of the caller's span `parent_id` when there is one. The number of spans exported."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
    from opentelemetry.trace.status import Status, StatusCode

    tracer = exporting.tracer_get()
    ids: dict[str, str] = {}
    trace_int = int(trace_id, 16)
    done = 0
    keys = {f.key: f for f in facts}

    def depth(fact: SpanFact) -> int:
        n, seen = 0, set()
        while fact.key and fact.parent in keys and fact.parent not in seen:
            seen.add(fact.parent)
            fact, n = keys[fact.parent], n + 1
        return n

    for fact in sorted(facts, key=lambda f: (f.key != "", depth(f), f.start)):
        span_id = root_id if fact.key == "" else span_id_of(trace_id, fact.key)
        ids[fact.key] = span_id
        parent = ids.get(fact.parent, root_id) if fact.key else parent_id
        context = None
        if parent:
            remote = fact.key == ""
            context = trace.set_span_in_context(NonRecordingSpan(SpanContext(
                trace_int, int(parent, 16), is_remote=remote, trace_flags=TraceFlags(TraceFlags.SAMPLED))))
        token = _next_ids.set((trace_int, int(span_id, 16)))
        try:
            span = tracer.start_span(fact.name, context=context, kind=SpanKind.INTERNAL,
                                     attributes=attributes_clean(fact.attributes), start_time=ns(fact.start))
        finally:
            _next_ids.reset(token)
        for event in fact.events:
            span.add_event(event.name, attributes_clean(event.attributes), timestamp=ns(event.at))
        if fact.error:
            span.set_status(Status(StatusCode.ERROR, fact.error[:500]))
            span.set_attribute("error.type", fact.attributes.get("error.type", "failed") or "failed")
        span.end(end_time=ns(max(fact.end, fact.start)))
        done += 1
    return done


def attributes_clean(attributes: Mapping[str, Any]) -> dict[str, AttrValue]:
    """Attributes as OpenTelemetry takes them: None and empty strings left out."""
    return {k: v for k, v in attributes.items() if v is not None and v != ""}
