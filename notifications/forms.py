"""The settings page's forms: a channel, a subscription. Bad input is refused with a message per field."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

from agents.models import Agent
from notifications.models import Channel, Subscription, Trigger, channel_target_problem
from planner_site.formfields import TextField

url_validate = URLValidator(schemes=["http", "https"])


class ChannelForm(forms.Form):
    kind = forms.ChoiceField(label="Channel", choices=[c for c in Channel.Kind.choices if c[0] != Channel.Kind.SLACK_APP])
    target = TextField(label="URL or e-mail address", max_length=500, strip=True,
                       widget=forms.TextInput(attrs={"placeholder": "https://example.com/hook or you@example.com"}))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind, target = data.get("kind"), data.get("target")
        if kind and target:
            if kind == Channel.Kind.EMAIL:
                try:
                    forms.EmailField().clean(target)
                except ValidationError:
                    self.add_error("target", "Enter a valid e-mail address.")
            else:
                try:
                    url_validate(target)
                except ValidationError:
                    self.add_error("target", "Enter a valid http:// or https:// URL.")
                else:
                    if problem := channel_target_problem(kind, target):
                        self.add_error("target", problem)
        return data


class SubscriptionForm(forms.Form):
    kinds = forms.MultipleChoiceField(label="Tell me when", choices=Trigger.choices,
                                      widget=forms.CheckboxSelectMultiple)
    agents = forms.ModelMultipleChoiceField(label="Agents (none chosen: all)", required=False,
                                            queryset=Agent.objects.order_by("name"),
                                            widget=forms.CheckboxSelectMultiple)
    min_risk = forms.ChoiceField(label="Minimum risk", choices=Subscription.MinRisk.choices,
                                 initial=Subscription.MinRisk.SAFE)

    remind_after_minutes = forms.IntegerField(label="Remind me after (minutes)", required=False, min_value=1,
                                              max_value=10080)
    escalate_after_minutes = forms.IntegerField(label="Escalate after (minutes)", required=False, min_value=1,
                                                max_value=10080)
    escalate_to = forms.ModelChoiceField(label="to", required=False, queryset=Subscription.objects.none(),
                                         empty_label="nobody")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["kinds"].error_messages["required"] = "Choose at least one kind of notification."
        escalate_to = self.fields["escalate_to"]
        escalate_to.queryset = Subscription.objects.filter(active=True, user__is_active=True).select_related(  # type: ignore[attr-defined]
            "user").order_by("user__username", "pk")
        escalate_to.label_from_instance = lambda s: f"{s.user.get_username()}: subscription {s.pk}"  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("escalate_after_minutes") and not data.get("escalate_to"):
            self.add_error("escalate_to", "Choose whom to escalate to.")
        return data
