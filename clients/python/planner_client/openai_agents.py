"""The OpenAI Agents SDK on the dashboard: tool calls that need approval wait for an operator there.

    pip install "planner-client[openai-agents]"

    from agents import Agent, function_tool
    from planner_client import AsyncClient
    from planner_client.openai_agents import DashboardApprovals

    async with AsyncClient(url, token) as client:
        approvals = DashboardApprovals(client, risky=["send_email"])
        agent = Agent(name="Mailer", tools=approvals.guard(search, send_email))
        result = await approvals.run(agent, "Mail the Q3 report to Dana")

`run` is `Runner.run` that, whenever the SDK pauses on a tool call needing approval (its interruptions), posts
the call to the dashboard as a step awaiting approval, waits for the operator (the API's long poll), and resumes
the run with `state.approve(...)`, or `state.reject(...)` whose message, the one the model reads, carries the
operator's feedback. An approved call's output becomes its step's result on the dashboard; a declined call the
model gives up on (rather than trying again) is withdrawn when the run ends.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from agents import Agent, FunctionTool, Runner, RunResult, ToolApprovalItem, ToolCallOutputItem
from agents.run_context import RunContextWrapper

from planner_client.approvals import AsyncApprovalDesk, Decision, input_schema, needs_operator
from planner_client.client import DEFAULT_WAIT, AsyncClient

NeedsApproval = Callable[[RunContextWrapper[Any], dict[str, Any], str], Awaitable[bool]]


def rejection_message(tool: str, decision: Decision) -> str:
    """What the model reads instead of the tool's output when the operator said no."""
    if decision.stopped:
        return f"The call of {tool} was not made: {decision.feedback}"
    return f"An operator declined the call of {tool}. Their feedback: {decision.feedback}"


def output_value(output: Any) -> Any:
    """A tool's output as the dashboard stores it: JSON when it is JSON, its text otherwise."""
    try:
        json.dumps(output)
    except (TypeError, ValueError):
        return str(output)
    return output


class DashboardApprovals:
    """Operators approve or decline this agent's tool calls on the dashboard.

    client: an `AsyncClient` with the agent's token. risky: names of tools declared risky on the dashboard
    (besides those with `needs_approval=True`): with the agent's "permission" policy only their calls wait for an
    operator; with the "plan" policy every call does. goal: the plans' goal on the dashboard (default: the run's
    input). wait: seconds of one long poll.
    """

    def __init__(self, client: AsyncClient, *, risky: Iterable[str] = (), goal: str | None = None,
                 wait: float = DEFAULT_WAIT) -> None:
        self.client = client
        self.risky = set(risky)
        self.goal = goal
        self.wait = wait
        self.desk: AsyncApprovalDesk | None = None

    def needs_approval(self, tool: str) -> NeedsApproval:
        """A `needs_approval` callable for `tool`: asks the dashboard whether an operator decides its calls (the
        agent's approval policy and the tool's declared risk, as the operators set them)."""

        async def ask(context: RunContextWrapper[Any], arguments: dict[str, Any], call_id: str) -> bool:
            return needs_operator(await self.client.agent(), tool)

        return ask

    def guard(self, *tools: FunctionTool) -> list[FunctionTool]:
        """The tools, each with the dashboard's `needs_approval` (unless it already always needs approval)."""
        for tool in tools:
            if tool.needs_approval is not True:
                tool.needs_approval = self.needs_approval(tool.name)
        return list(tools)

    def declarations(self, agent: Agent[Any]) -> list[dict[str, Any]]:
        """The agent's function tools as the dashboard declares them."""
        return [{"name": tool.name, "description": (tool.description or "")[:500],
                 "input_schema": input_schema(tool.params_json_schema),
                 "risk": "risky" if tool.name in self.risky or tool.needs_approval is True else "safe"}
                for tool in agent.tools if isinstance(tool, FunctionTool)]

    async def run(self, agent: Agent[Any], input: str | list[Any], **runner_options: Any) -> RunResult:
        """`Runner.run(agent, input, ...)` until the run ends, every approval decided on the dashboard."""
        await self.client.declare_tools(self.declarations(agent))
        goal = self.goal or (input if isinstance(input, str) else f"Run of {agent.name}")
        self.desk = desk = AsyncApprovalDesk(self.client, goal=goal, wait=self.wait)
        result = await Runner.run(agent, input, **runner_options)
        while result.interruptions:
            state = result.to_state()
            started: dict[str, int] = {}  # call id -> its step, approved and started
            for index, item in enumerate(result.interruptions):
                # The first call of a batch may revise a declined one; calls made beside it are not revisions.
                decision = await self.decide(desk, item, revise=index == 0)
                if decision.approved:
                    state.approve(item)
                    if decision.step_id is not None and item.call_id:
                        started[item.call_id] = decision.step_id
                else:
                    state.reject(item, rejection_message=rejection_message(item.name or "the tool", decision))
            try:
                result = await Runner.run(agent, state, **runner_options)
            except Exception as exc:  # the approved calls' steps say how the run ended, not "running" for ever
                for step_id in started.values():
                    await desk.report(step_id, error=f"the run failed: {type(exc).__name__}: {exc}"[:4000])
                raise
            await self.report(desk, result, started)
        await desk.close()  # a declined call the model did not try again: its plan is withdrawn
        return result

    async def decide(self, desk: AsyncApprovalDesk, item: ToolApprovalItem, *, revise: bool = True) -> Decision:
        try:
            arguments = json.loads(item.arguments or "{}")
        except ValueError:
            arguments = {"arguments": item.arguments}
        if not isinstance(arguments, dict):
            arguments = {"arguments": arguments}
        return await desk.ask_call(item.name or "tool", arguments, revise=revise)

    async def report(self, desk: AsyncApprovalDesk, result: RunResult, started: dict[str, int]) -> None:
        """Each approved call's output on its step (the SDK ran it while resuming)."""
        outputs = {item.call_id: item.output for item in result.new_items
                   if isinstance(item, ToolCallOutputItem) and item.call_id in started}
        for call_id, step_id in started.items():
            if call_id in outputs:
                await desk.report(step_id, output_value(outputs[call_id]))
            else:
                await desk.report(step_id, error="the run resumed without running this call")
