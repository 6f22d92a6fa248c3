"""Operator forms. Every text and JSON value is checked by the same validators as the services
(planner_site/validators.py), so a bad value is refused with a clear message before any service runs."""

from __future__ import annotations

from typing import Any

from django import forms

from agents.models import Agent
from agents.tools import TOOLS
from goals.models import Goal
from planner_site.formfields import TextField
from planner_site.validators import JSON_MAX_CHARS, InputError, json_parse
from planning.models import Plan, PlanStep


class DeclineForm(forms.Form):
    feedback = TextField(
        label="Feedback", max_length=2000, strip=True,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "Why not? The agent replans with this."}),
    )


class ApproveplanForm(forms.Form):
    mode = forms.ChoiceField(label="Approval", choices=[(Plan.ApprovalMode.ALL, "All steps"), (Plan.ApprovalMode.STEP, "Step by step")])


class ReasonForm(forms.Form):
    reason = TextField(label="Reason", max_length=2000, required=False, strip=True)


class AcceptDoneForm(forms.Form):
    note = TextField(label="Note", max_length=2000, required=False, strip=True)


class ReplanForm(forms.Form):
    reason = TextField(label="Reason", max_length=2000, strip=True)


class GoalForm(forms.Form):
    description = TextField(label="Goal", max_length=500, strip=True,
                            widget=forms.TextInput(attrs={"placeholder": "e.g. convert data.csv to JSON"}))
    horizon = forms.ChoiceField(label="Horizon", choices=Goal.Horizon.choices, initial=Goal.Horizon.SHORT)


class AgentStatusForm(forms.Form):
    status = forms.ChoiceField(label="Status", choices=[("running", "Resume"), ("paused", "Pause"), ("stopped", "Stop")])


def agent_tool_names(agent: Agent) -> list[str]:
    """The tools an agent's steps may call: an external agent's declared ones, a tool agent's own (when it was
    given some), else the built-in ones."""
    if agent.kind == Agent.Kind.EXTERNAL:
        return sorted(str(t.get("name", "")) for t in agent.declared_tools)
    if agent.kind == Agent.Kind.AGUI:  # a remote AG-UI agent's tools: those its runs called
        return sorted(set(PlanStep.objects.filter(plan__agent=agent).exclude(tool="").values_list("tool", flat=True)))
    if agent.kind == Agent.Kind.TOOL and agent.tools:
        return sorted(t for t in agent.tools if t in TOOLS)
    return sorted(TOOLS)


def tool_choice(name: str) -> tuple[str, str]:
    spec = TOOLS[name]
    return name, f"{name}: {spec.description} ({'risky: waits for approval' if spec.risky else 'safe: reads only'})"


class AguiAgentForm(forms.Form):
    """The New agent page's remote AG-UI agent: a name and the URL that takes its runs."""

    name = TextField(label="AG-UI agent name", max_length=100, strip=True,
                     widget=forms.TextInput(attrs={"placeholder": "e.g. Release helper", "autocomplete": "off"}))
    url = forms.CharField(label="Agent URL", max_length=500, strip=True,
                          widget=forms.URLInput(attrs={"placeholder": "https://agent.example.com/run"}))


class AgentCreateForm(forms.Form):
    """The dashboard's New agent: a tool agent, its name, what it is for and the built-in tools it may use."""

    name = TextField(label="Name", max_length=100, strip=True,
                     widget=forms.TextInput(attrs={"placeholder": "e.g. Data clerk", "autocomplete": "off"}))
    backstory = TextField(label="What it is for", max_length=2000, required=False, strip=True,
                          widget=forms.Textarea(attrs={"rows": 2, "placeholder": "e.g. Converts the team's CSV files"}))
    tools = forms.MultipleChoiceField(
        label="Tools it may use", widget=forms.CheckboxSelectMultiple, initial=sorted(TOOLS),
        choices=[tool_choice(name) for name in sorted(TOOLS)],
        error_messages={"required": "Choose at least one tool the agent may use."},
    )


class A2AAgentAddForm(forms.Form):
    """The New agent page's Add a remote A2A agent: the address of its agent card (docs/a2a-agents.md)."""

    url = TextField(label="Agent card address", max_length=500, strip=True,
                    widget=forms.URLInput(attrs={"placeholder": "e.g. https://agent.example.com/.well-known/agent-card.json",
                                                 "autocomplete": "off"}))
    # Never shown back (not even on a refused form): kept on the agent, sent only to its card's origin.
    credential = forms.CharField(label="Credential (if its card asks for one)", max_length=2000, required=False,
                                 strip=True, widget=forms.PasswordInput(render_value=False,
                                                                        attrs={"autocomplete": "off"}))


class A2ACredentialForm(forms.Form):
    """A remote A2A agent's page: replace the credential sent to it, or remove it (docs/a2a-agents.md)."""

    action = forms.ChoiceField(choices=[("replace", "Replace"), ("remove", "Remove")], initial="replace")
    # Never shown back, as on the New agent page.
    credential = forms.CharField(label="New credential", max_length=2000, required=False, strip=True,
                                 widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "off"}))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("action") == "replace" and not data.get("credential"):
            raise forms.ValidationError("Give the new credential, or choose Remove. Nothing was changed.")
        return data


class WorkspaceUploadForm(forms.Form):
    """The agent page's Upload files: the files come from request.FILES ("files"), the rest from here."""

    folder = TextField(label="Into folder", max_length=200, required=False, strip=True,
                       widget=forms.TextInput(attrs={"placeholder": "(the workspace itself) e.g. notes"}))
    replace = forms.BooleanField(label="Replace files of the same name", required=False)


class StepEditForm(forms.Form):
    description = TextField(label="Description", max_length=500)
    action_hint = TextField(label="Action", max_length=200, required=False)
    tool = forms.ChoiceField(label="Tool", required=False, choices=[("", "-")] + [(n, n) for n in sorted(TOOLS)])
    tool_input = forms.CharField(label="Input (JSON)", required=False, max_length=JSON_MAX_CHARS,
                                 widget=forms.Textarea(attrs={"rows": 3}))
    expected_outcome = TextField(label="Expected outcome", max_length=500, required=False)
    requires_permission = forms.BooleanField(label="Requires permission", required=False)
    reason = TextField(label="Reason", max_length=2000, required=False)

    def __init__(self, *args: Any, tools: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if tools is not None:  # an external agent's own tools
            self.fields["tool"].choices = [("", "-")] + [(n, n) for n in tools]  # type: ignore[attr-defined]

    def clean_tool_input(self) -> dict[str, Any]:
        raw = self.cleaned_data.get("tool_input") or "{}"
        try:
            value = json_parse(raw)
        except InputError as exc:
            raise forms.ValidationError(f"Input {exc}.") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("Input must be a JSON object, like {\"path\": \"data.csv\"}.")
        return value


class ClarifyForm(forms.Form):
    answer = TextField(label="Answer", max_length=2000, strip=True)
