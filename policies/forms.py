"""The policies page's forms: every text checked like the services check it, so a bad value is refused with a
message before any service runs."""

from __future__ import annotations

from typing import Any

from django import forms

from agents.models import Agent
from planner_site.formfields import TextField
from policies.engine import rule_problems
from policies.models import Rule
from policies.services import RULE_FIELDS


class PolicyForm(forms.Form):
    name = TextField(label="Name", max_length=100)
    description = TextField(label="Description", max_length=500, required=False)
    position = forms.IntegerField(label="Order", min_value=1, max_value=10_000, initial=1,
                                  help_text="Policies are tried in this order, lowest first")


class RuleForm(forms.ModelForm):
    tools = TextField(label="Tools or actions", max_length=500, required=False,
                      help_text="Comma-separated; empty: any. A plan matches when every step uses one of them.")
    reason = TextField(label="Reason", max_length=500, required=False,
                       help_text="Said with the decision; required to decline (the agent replans with it)")

    class Meta:
        model = Rule
        fields = list(RULE_FIELDS)
        widgets = {"active_from": forms.TimeInput(attrs={"type": "time"}, format="%H:%M"),
                   "active_until": forms.TimeInput(attrs={"type": "time"}, format="%H:%M")}
        labels = {"approve_risky": "Applies to risky items", "approve_permission": "Applies to steps that require permission",
                  "max_estimated_cycles": "Estimated cost at most (cycles)", "applies_to": "Decides",
                  "requires_permission": "Permission"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["agent"].queryset = Agent.objects.order_by("name")  # type: ignore[attr-defined]
        self.fields["agent"].empty_label = "any agent"  # type: ignore[attr-defined]
        self.fields["position"].required = False
        self.fields["position"].min_value = 1  # type: ignore[attr-defined]
        self.fields["position"].max_value = 10_000  # type: ignore[attr-defined]

    def validate_unique(self) -> None:
        """Positions are checked by the service, with the policy locked."""

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        probe = Rule(**{k: v for k, v in data.items() if k in RULE_FIELDS and k != "agent"})
        probe.reason = " ".join(str(data.get("reason") or "").split())
        for problem in rule_problems(probe):
            self.add_error(None, problem)
        return data

    def values(self) -> dict[str, Any]:
        data = {k: v for k, v in self.cleaned_data.items() if k in RULE_FIELDS}
        if data.get("position") is None:
            data.pop("position", None)
        return data


class BudgetForm(forms.Form):
    agent = forms.ModelChoiceField(label="Agent", queryset=Agent.objects.order_by("name"), required=False,
                                   empty_label="every agent without its own")
    daily_limit = forms.DecimalField(label="USD per day", min_value=0, max_value=999_999, decimal_places=6,
                                     max_digits=12, required=False)
    plan_limit = forms.DecimalField(label="USD per plan", min_value=0, max_value=999_999, decimal_places=6,
                                    max_digits=12, required=False)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("daily_limit") is None and data.get("plan_limit") is None and not self.errors:
            raise forms.ValidationError("Set a daily limit, a plan limit or both.")
        return data
