"""An OpenAI Agents SDK agent whose emails wait for an operator on the dashboard (run by test_framework_agents.py).

Run as a script of its own, as a user's agent is: the SDK's package is named `agents`, like the dashboard's
Django app, so it cannot share the test process. Prints one JSON line: the run's final output and the emails sent.
Environment: PLANNER_URL, PLANNER_TOKEN, OPENAI_BASE_URL, MODEL.
"""

from __future__ import annotations

import asyncio
import json
import os

from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from planner_client import AsyncClient
from planner_client.openai_agents import DashboardApprovals

SENT: list[dict[str, str]] = []


@function_tool
def search_wiki(query: str) -> str:
    """Search the company wiki."""
    return f"Q3 report: revenue up 12% (searched for {query!r})"


@function_tool
def send_email(to: str, body: str) -> str:
    """Send an email."""
    SENT.append({"to": to, "body": body})
    return f"sent to {to}"


async def main() -> None:
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model=os.environ["MODEL"], openai_client=AsyncOpenAI(
        base_url=os.environ["OPENAI_BASE_URL"], api_key="test-key", max_retries=0))
    async with AsyncClient(os.environ["PLANNER_URL"], os.environ["PLANNER_TOKEN"]) as client:
        approvals = DashboardApprovals(client, risky=["send_email"], wait=5)
        agent = Agent(name="Mailer", instructions="Mail what you find.", model=model,
                      tools=approvals.guard(search_wiki, send_email))
        result = await approvals.run(agent, "Mail the Q3 summary to Dana")
    print(json.dumps({"final": result.final_output, "sent": SENT}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
