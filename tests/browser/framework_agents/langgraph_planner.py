"""A LangGraph agent that plans first, then mails the result, every decision taken on the dashboard (run by
test_framework_agents.py).

draft/review: the model writes a plan; the whole plan goes to the dashboard (declined: the model plans again
with the operator's feedback). work: the approved plan's steps run as the operator allows. write/send: the model
writes the email; sending it interrupts the graph until an operator decides (declined: the model rewrites it
with the feedback). Prints one JSON line: the emails sent and the plan's outputs.
Environment: PLANNER_URL, PLANNER_TOKEN, OPENAI_BASE_URL, MODEL.
"""

from __future__ import annotations

import json
import os
from typing import Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from openai import OpenAI

from planner_client import Client
from planner_client.langgraph import GraphApprovals, request_plan_approval

GOAL = "Mail the Q3 summary to Dana"
TOOLS = [
    {"name": "search", "description": "Search the company wiki", "risk": "safe",
     "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
    {"name": "send_email", "description": "Send an email", "risk": "risky",
     "input_schema": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                      "required": ["to", "body"]}},
]
SENT: list[dict[str, str]] = []


class State(TypedDict, total=False):
    steps: list[dict[str, Any]]
    feedback: str
    plan_id: int
    found: dict[str, Any]
    email: dict[str, str]
    mail_feedback: str
    sent: bool


def search(query: str) -> str:
    return f"Q3 report: revenue up 12% (searched for {query!r})"


def send_email(to: str, body: str) -> str:
    SENT.append({"to": to, "body": body})
    return f"sent to {to}"


def build(approvals: GraphApprovals, model: OpenAI) -> Any:
    """Each model call in a node of its own, before the node that interrupts: a node runs again from its start
    when the graph resumes, and the model must not be asked twice."""
    name = os.environ["MODEL"]

    def ask(prompt: str) -> str:
        reply = model.chat.completions.create(model=name, messages=[{"role": "user", "content": prompt}])
        return reply.choices[0].message.content or ""

    def draft(state: State) -> State:
        prompt = f"Plan this goal as JSON steps: {GOAL}"
        if state.get("feedback"):
            prompt += f"\nAn operator declined your last plan: {state['feedback']}"
        return {"steps": json.loads(ask(prompt))["steps"]}

    def review(state: State) -> State:
        verdict = request_plan_approval(GOAL, state["steps"])
        if verdict["approved"]:
            return {"plan_id": verdict["plan_id"], "feedback": ""}
        return {"feedback": verdict["feedback"]}

    def work(state: State) -> State:
        return {"found": approvals.run_plan(state["plan_id"], {"search": search})}

    def write(state: State) -> State:
        prompt = f"Write the email to Dana about: {json.dumps(state['found'])}"
        if state.get("mail_feedback"):
            prompt += f"\nAn operator declined your last email: {state['mail_feedback']}"
        return {"email": json.loads(ask(prompt))}

    def send(state: State) -> State:
        email = state["email"]
        outcome = approvals.call("send_email", email, run=send_email, intent=f"Mail {email['to']}: {email['body']}")
        return {"sent": outcome.approved, "mail_feedback": outcome.feedback}

    graph = StateGraph(State)
    for node in (draft, review, work, write, send):
        graph.add_node(node.__name__, node)
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "review")
    graph.add_conditional_edges("review", lambda s: "draft" if s.get("feedback") else "work")
    graph.add_edge("work", "write")
    graph.add_edge("write", "send")
    graph.add_conditional_edges("send", lambda s: END if s.get("sent") else "write")
    return graph.compile(checkpointer=InMemorySaver(), name="Q3 mailer")


def main() -> None:
    model = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="test-key", max_retries=0)
    with Client(os.environ["PLANNER_URL"], os.environ["PLANNER_TOKEN"]) as client:
        approvals = GraphApprovals(client, tools=TOOLS, goal=GOAL, wait=5)
        graph = build(approvals, model)
        state = approvals.invoke(graph, {}, {"configurable": {"thread_id": "q3"}})
    print(json.dumps({"sent": SENT, "found": state.get("found")}), flush=True)


if __name__ == "__main__":
    main()
