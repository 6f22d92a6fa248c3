"""The settings page's forms: a channel, a subscription. Bad input is refused with a message per field."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator

from agents.models import Agent
from notifications.models import Channel, Subscription, Trigger
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
        return data


class SubscriptionForm(forms.Form):
    kinds = forms.MultipleChoiceField(label="Tell me when", choices=Trigger.choices,
                                      widget=forms.CheckboxSelectMultiple)
    agents = forms.ModelMultipleChoiceField(label="Agents (none chosen: all)", required=False,
                                            queryset=Agent.objects.order_by("name"),
                                            widget=forms.CheckboxSelectMultiple)
    min_risk = forms.ChoiceField(label="Minimum risk", choices=Subscription.MinRisk.choices,
                                 initial=Subscription.MinRisk.SAFE)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["kinds"].error_messages["required"] = "Choose at least one kind of notification."
