"""LangGraph on the dashboard: a graph's `interrupt()`s become steps an operator decides there.

    pip install "planner-client[langgraph]"

    from planner_client import Client
    from planner_client.langgraph import GraphApprovals

    approvals = GraphApprovals(Client(url, token), tools=[...])   # the tools' declarations, as for the API

    def send(state):                                 # a node of the graph (compiled with a checkpointer)
        outcome = approvals.call("send_email", {"to": state["to"], "body": state["body"]}, run=send_email)
        return {"sent": outcome.approved, "feedback": outcome.feedback}

    approvals.invoke(graph, {"to": "dana@example.com"}, {"configurable": {"thread_id": "1"}})

`approvals.call(...)` (or `request_approval(...)` for the decision alone) interrupts the graph; `invoke` posts the
call to the dashboard as a step awaiting approval, waits for the operator, and resumes the graph with
`Command(resume=...)` holding the decision (`approved`, `feedback`). For graphs that plan first,
`request_plan_approval(goal, steps)` submits the whole plan: the operator approves it, or declines it with
feedback that the graph can plan again with; `run_plan` then runs its steps as the operator allows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from langgraph.types import Command, interrupt

from planner_client.approvals import ApprovalDesk, Decision
from planner_client.client import DEFAULT_WAIT, Client

KIND = "planner"  # the key that marks an interrupt's value as one for the dashboard


def request_approval(tool: str, arguments: dict[str, Any], *, intent: str | None = None) -> dict[str, Any]:
    """In a node: pause the graph until an operator decides this call on the dashboard; the decision as a dict
    (`approved`, `feedback`, `step_id`, `plan_id`, `stopped`)."""
    value = interrupt({KIND: "call", "tool": tool, "input": dict(arguments), "intent": intent})
    return dict(value)


def request_plan_approval(goal: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """In a node: pause the graph until an operator approves this plan (`approved` True, `plan_id` to run it
    with `run_plan`) or declines it (`approved` False, `feedback` to plan again with). The steps are the API's
    (`id`, `tool`, `intent`, `input`, `requiresPermission`, `dependencies`); a plan after a declined one is
    submitted as its next version."""
    value = interrupt({KIND: "plan", "goal": goal, "steps": list(steps)})
    return dict(value)


@dataclass(frozen=True)
class CallOutcome:
    """What became of a call: approved and run (`output`), or not (`feedback` says why)."""

    approved: bool
    output: Any = None
    feedback: str = ""


class GraphApprovals:
    """Runs a graph with its approvals decided on the dashboard.

    client: a `Client` with the agent's token. tools: the tools' declarations (`name`, `description`,
    `input_schema`, `risk`), declared once before the first run (leave out if already declared). goal: the
    goal of the one-call plans (default: "Run of <graph name>"). wait: seconds of one long poll.
    """

    def __init__(self, client: Client, *, tools: list[dict[str, Any]] | None = None, goal: str | None = None,
                 wait: float = DEFAULT_WAIT) -> None:
        self.client = client
        self.tools = tools
        self.goal = goal
        self.wait = wait
        self.desk = ApprovalDesk(client, goal=goal or "Agent run", wait=wait)
        self.outputs: dict[int, Any] = {}  # step id -> output of a call that ran

    def invoke(self, graph: Any, input: Any, config: Mapping[str, Any], **options: Any) -> Any:
        """`graph.invoke(input, config)` until the graph ends, each dashboard interrupt decided by an operator.

        The graph needs a checkpointer and `config` a thread id, as every LangGraph interrupt does. Interrupts
        not made with this module's helpers are left to the caller: `invoke` returns with them pending."""
        if self.tools is not None:
            self.client.declare_tools(self.tools)
            self.tools = None
        if self.goal is None:
            self.desk.goal = f"Run of {getattr(graph, 'name', None) or 'the graph'}"
        result = graph.invoke(input, config, **options)
        while True:
            pending = graph.get_state(config).interrupts
            ours = [i for i in pending if isinstance(i.value, Mapping) and i.value.get(KIND) in ("call", "plan")]
            if not pending:
                self.desk.close()  # a declined call or plan the graph went on without is withdrawn
                return result
            if len(ours) != len(pending):
                return result
            # The first interrupt may revise a declined call or plan; those raised beside it are not revisions.
            resume = {i.id: self.decide(i.value, revise=n == 0).as_dict() for n, i in enumerate(ours)}
            result = graph.invoke(Command(resume=resume), config, **options)

    def decide(self, value: Mapping[str, Any], *, revise: bool = True) -> Decision:
        if value[KIND] == "plan":
            return self.desk.ask_plan(str(value.get("goal") or self.desk.goal), list(value.get("steps") or []),
                                      revise=revise)
        return self.desk.ask_call(str(value["tool"]), dict(value.get("input") or {}), intent=value.get("intent"),
                                  revise=revise)

    def call(self, tool: str, arguments: dict[str, Any], run: Callable[..., Any], *,
             intent: str | None = None) -> CallOutcome:
        """In a node: the call waits for an operator; approved, `run(**arguments)` runs and its output (or its
        exception) is the step's result on the dashboard."""
        decision = request_approval(tool, arguments, intent=intent)
        if not decision.get("approved"):
            return CallOutcome(approved=False, feedback=str(decision.get("feedback", "")))
        step_id = decision.get("step_id")
        if step_id in self.outputs:  # the node runs again after a later interrupt of its own: the call ran
            return CallOutcome(approved=True, output=self.outputs[step_id])
        try:
            output = run(**arguments)
        except Exception as exc:
            if step_id is not None:
                self.desk.report(int(step_id), error=f"{type(exc).__name__}: {exc}"[:4000])
            raise
        if step_id is not None:
            self.desk.report(int(step_id), output)
            self.outputs[step_id] = output
        return CallOutcome(approved=True, output=output)

    def run_plan(self, plan_id: int, tools: Mapping[str, Callable[..., Any]]) -> dict[str, Any]:
        """In a node, after the plan was approved: run its steps as the operator allows (blocking while a step
        awaits approval), each reported on the dashboard; the outputs by step key. Raises the client's
        `ReplanNeeded` when an operator declines a step, `PlanCancelled` when the plan is cancelled."""
        outputs: dict[str, Any] = {}
        for step in self.client.steps(plan_id, wait=self.wait):
            try:
                output = tools[step.tool](**step.input)
            except Exception as exc:
                self.client.fail(step, f"{type(exc).__name__}: {exc}"[:4000])
                raise
            self.client.complete(step, output)
            outputs[step.key] = output
        return outputs
