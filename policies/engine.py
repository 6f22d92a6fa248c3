"""What a policy decides for one item that waits for a person: plain values in, the first matching rule out.

The same function decides live (policies/services.py) and in the dry run (policies/selectors.py), so the dry
run shows exactly what switching a policy on would do."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import time

from policies.models import Rule

EXTERNAL = "external"  # agents.models.Agent.Kind.EXTERNAL (the engine takes plain values)


@dataclass(frozen=True)
class Item:
    """What a rule looks at: a step that waits for approval, or a whole plan awaiting approval."""

    kind: str  # "step" or "plan"
    agent_id: int
    tools: tuple[str, ...]  # a step's tool (or persona action); a plan's steps' tools
    risky: bool
    requires_permission: bool
    estimated_cycles: int
    at: time  # the time of day (server time) it started to wait
    external: bool = False  # an external agent's: its tools are the ones it declared, its risks its own word


def item_of_agent(item: Item, *, agent_kind: str) -> Item:
    """The item as policies see it, by the kind of agent it comes from. An external agent's tools are the ones it
    declared itself (a name it chose, maybe a built-in tool's), so they match only rules scoped to that agent;
    and the risk it declared never makes a step "safe" for a policy: its items count as risky."""
    if agent_kind != EXTERNAL:
        return item
    return replace(item, external=True, risky=True)


@dataclass(frozen=True)
class Match:
    rule: Rule
    action: str

    @property
    def label(self) -> str:
        """The actor of the decision, as the timeline and the audit log show it."""
        return f"policy: {self.rule.policy.name}, rule {self.rule.position}"[:150]

    @property
    def detail(self) -> dict[str, object]:
        return {"policy": self.rule.policy_id, "policy_name": self.rule.policy.name, "rule": self.rule.position,
                "rule_id": self.rule.pk, "action": self.action}


def time_within(at: time, start: time | None, end: time | None) -> bool:
    """Whether `at` falls in [start, end); a window whose end is before its start wraps past midnight."""
    if start is None and end is None:
        return True
    if start is None:
        return at < end  # type: ignore[operator]
    if end is None:
        return at >= start
    if start <= end:
        return start <= at < end
    return at >= start or at < end


def rule_matches(rule: Rule, item: Item) -> bool:
    """Every condition the rule sets holds for the item, and the safe defaults allow its action."""
    if rule.applies_to != Rule.Applies.BOTH and rule.applies_to != ("steps" if item.kind == "step" else "plans"):
        return False
    if rule.agent_id is not None and rule.agent_id != item.agent_id:
        return False
    names = rule.tool_names
    if names and item.external and rule.agent_id != item.agent_id:
        return False  # a rule's tools are the built-in tools; a declared tool is matched by its agent's rules only
    if names and (not item.tools or any(tool not in names for tool in item.tools)):
        return False
    if rule.risk == Rule.Risk.SAFE and item.risky or rule.risk == Rule.Risk.RISKY and not item.risky:
        return False
    if (rule.requires_permission == Rule.Permission.YES and not item.requires_permission
            or rule.requires_permission == Rule.Permission.NO and item.requires_permission):
        return False
    if rule.max_estimated_cycles is not None and item.estimated_cycles > rule.max_estimated_cycles:
        return False
    if not time_within(item.at, rule.active_from, rule.active_until):
        return False
    if rule.action == Rule.Action.APPROVE:
        # Safe defaults: a risky item, or a step that needs permission, is approved only by a rule that names it.
        # (A plan approved by a policy leaves its steps that need permission waiting, each decided on its own.)
        if item.risky and not rule.approve_risky:
            return False
        if item.kind == "step" and item.requires_permission and not rule.approve_permission:
            return False
    return True


def rules_decide(rules: Iterable[Rule], item: Item) -> Match | None:
    """The first rule (in policy order, then rule order) that matches, or None: a person decides."""
    for rule in rules:
        if rule_matches(rule, item):
            return Match(rule=rule, action=rule.action)
    return None


def rule_problems(rule: Rule) -> list[str]:
    """What makes a rule contradict itself, each said so that an operator can fix it."""
    problems = []
    if rule.action == Rule.Action.DECLINE and not rule.reason.strip():
        problems.append("A decline needs a reason: the agent replans with it as feedback.")
    if rule.action == Rule.Action.APPROVE:
        if rule.risk == Rule.Risk.RISKY and not rule.approve_risky:
            problems.append("This rule approves only risky items but does not tick “Applies to risky”: it would "
                            "never approve anything.")
        if (rule.requires_permission == Rule.Permission.YES and not rule.approve_permission
                and rule.applies_to == Rule.Applies.STEPS):
            problems.append("This rule approves only steps that require permission but does not tick “Applies to "
                            "steps that require permission”: it would never approve anything.")
    if rule.active_from is not None and rule.active_from == rule.active_until:
        problems.append("The time window starts and ends at the same time: it would never apply.")
    return problems


@dataclass(frozen=True)
class ToolScope:
    """Which agents' tools a rule's tool names would match, in words for the policy page and the dry run."""

    text: str
    unknown: tuple[str, ...] = ()  # names that are no tool there: the rule would never match by them


def rule_tool_scope(rule: Rule, *, builtin: Iterable[str], agent_kind: str | None = None,
                    declared: Iterable[str] = ()) -> ToolScope:
    """`builtin`: the built-in tools and persona actions; `agent_kind` and `declared`: the rule's own agent's
    kind and declared tools, when it is scoped to one."""
    names = rule.tool_names
    if not names:
        return ToolScope("any tool, of any agent (an external agent's items always count as risky)")
    if rule.agent_id is not None and agent_kind == EXTERNAL:
        agent = rule.agent.name if rule.agent is not None else f"agent {rule.agent_id}"
        known = set(declared)
        return ToolScope(", ".join(f"{agent}: {n}" for n in names) + f" (tools {agent} declared; counted as risky)",
                         tuple(n for n in names if n not in known))
    known = set(builtin)
    whose = f"of {rule.agent.name}" if rule.agent is not None else "of tool and persona agents"
    return ToolScope(f"built-in {', '.join(names)} {whose}, never an external agent's declared tools",
                     tuple(n for n in names if n not in known))


def ordered(rules: Sequence[Rule]) -> list[Rule]:
    return sorted(rules, key=lambda r: (r.policy.position, r.policy.name, r.position))
