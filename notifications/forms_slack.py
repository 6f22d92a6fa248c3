"""The settings page's form for a Slack app channel: the Slack channel to post in, the app's bot token and signing
secret (password fields: typed once, never shown back)."""

from __future__ import annotations

import re

from django import forms
from django.core.exceptions import ValidationError

from planner_site.formfields import TextField

SLACK_CHANNEL_ID = re.compile(r"^[CGD](?=[A-Z0-9]*[0-9])[A-Z0-9]{6,39}$")  # e.g. C0123456789


class SlackAppChannelForm(forms.Form):
    target = TextField(label="Slack channel ID", max_length=40, strip=True,
                       help_text="e.g. C0123456789 (in Slack: the channel's details, at the bottom)",
                       widget=forms.TextInput(attrs={"placeholder": "C0123456789"}))
    bot_token = forms.CharField(label="Bot token", max_length=255, strip=True,
                                widget=forms.PasswordInput(attrs={"placeholder": "xoxb-…"}, render_value=False))
    signing_secret = forms.CharField(label="Signing secret", max_length=128, strip=True,
                                     widget=forms.PasswordInput(render_value=False))

    def clean_target(self) -> str:
        target = str(self.cleaned_data["target"]).upper()
        if not SLACK_CHANNEL_ID.match(target):
            raise ValidationError("Enter a Slack channel ID, like C0123456789.")
        return target

    def clean_bot_token(self) -> str:
        token = str(self.cleaned_data["bot_token"])
        if not token.startswith("xoxb-"):
            raise ValidationError("Enter the app's bot token: it starts with xoxb-.")
        return token
