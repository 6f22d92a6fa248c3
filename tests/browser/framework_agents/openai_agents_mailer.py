"""An OpenAI Agents SDK agent whose emails wait for an operator on the dashboard (run by test_framework_agents.py).

Run as a script of its own, as a user's agent is: the SDK's package is named `agents`, like the dashboard's
Django app, so it cannot share the test process. Prints one JSON line: the run's final output and the emails sent.
Environment: PLANNER_URL, PLANNER_TOKEN, OPENAI_BASE_URL, MODEL; with OTEL_EXPORTER_OTLP_ENDPOINT set, the agent
traces its own run with OpenTelemetry and exports it there, as an agent of a traced fleet does (the client then
sends its traceparent, so the dashboard's spans join the agent's trace: tests/tracing/test_framework_traces.py).
"""

from __future__ import annotations

import asyncio
import json
import os

from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
from openai import AsyncOpenAI
from opentelemetry import trace

from planner_client import AsyncClient
from planner_client.openai_agents import DashboardApprovals

SENT: list[dict[str, str]] = []
tracer = trace.get_tracer("mailer")  # a no-op until a provider is set (tracing_start)


@function_tool
def search_wiki(query: str) -> str:
    """Search the company wiki."""
    return f"Q3 report: revenue up 12% (searched for {query!r})"


@function_tool
def send_email(to: str, body: str) -> str:
    """Send an email."""
    with tracer.start_as_current_span("execute_tool send_email", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "send_email"}):
        SENT.append({"to": to, "body": body})
        return f"sent to {to}"


def tracing_start() -> None:
    """The agent's own OpenTelemetry tracing, to OTEL_EXPORTER_OTLP_ENDPOINT when it is set (the SDK's traces,
    sent to OpenAI's platform by default, stay off: no network)."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "mailer"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))  # the endpoint from the environment
    trace.set_tracer_provider(provider)


async def main() -> None:
    set_tracing_disabled(True)
    tracing_start()
    model = OpenAIChatCompletionsModel(model=os.environ["MODEL"], openai_client=AsyncOpenAI(
        base_url=os.environ["OPENAI_BASE_URL"], api_key="test-key", max_retries=0))
    async with AsyncClient(os.environ["PLANNER_URL"], os.environ["PLANNER_TOKEN"]) as client:
        approvals = DashboardApprovals(client, risky=["send_email"], wait=5)
        agent = Agent(name="Mailer", instructions="Mail what you find.", model=model,
                      tools=approvals.guard(search_wiki, send_email))
        with tracer.start_as_current_span("invoke_agent Mailer", attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "Mailer"}):
            result = await approvals.run(agent, "Mail the Q3 summary to Dana")
    provider = trace.get_tracer_provider()
    if hasattr(provider, "shutdown"):
        provider.shutdown()  # its spans sent before the process ends
    print(json.dumps({"final": result.final_output, "sent": SENT}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
