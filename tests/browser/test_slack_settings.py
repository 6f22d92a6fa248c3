"""The settings page's Slack parts as an operator meets them: a Slack app channel added (its secrets typed in
password fields, never shown back), a code made to connect one's Slack account, and a refused channel ID said in
words."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import OPERATOR, Login

pytestmark = pytest.mark.browser


def test_an_operator_adds_a_slack_app_and_makes_a_connect_code(login: Login) -> None:
    page = login(OPERATOR)
    page.goto("/notifications/settings/")
    section = page.locator("section[aria-labelledby=slack-heading]")
    expect(section).to_contain_text("/notifications/slack/interactions/")
    section.get_by_label("Slack channel ID").fill("general")
    section.get_by_label("Bot token").fill("xoxb-browser-token-1")
    section.get_by_label("Signing secret").fill("browser-signing-secret")
    section.get_by_role("button", name="Add Slack app channel").click()
    expect(page.get_by_text("Enter a Slack channel ID, like C0123456789. Nothing was changed.")).to_be_visible()

    section = page.locator("section[aria-labelledby=slack-heading]")
    section.get_by_label("Slack channel ID").fill("C0BROWSER1")
    section.get_by_label("Bot token").fill("xoxb-browser-token-1")
    section.get_by_label("Signing secret").fill("browser-signing-secret")
    section.get_by_role("button", name="Add Slack app channel").click()
    expect(page.get_by_text("Added Slack app (buttons that decide) C0BROWSER1.", exact=False)).to_be_visible()
    row = page.locator("table.notify-channels tr[data-kind=slackapp]")
    expect(row).to_contain_text("C0BROWSER1")
    expect(row).to_contain_text("kept, never shown")
    html = page.content()
    assert "xoxb-browser-token-1" not in html and "browser-signing-secret" not in html

    page.get_by_role("button", name="Make a code to connect my Slack account").click()
    note = page.get_by_text("Your code to connect Slack:")
    expect(note).to_be_visible()
    assert re.search(r"[A-Z2-9]{5}-[A-Z2-9]{5}", note.inner_text())
