"""Charts a person can read (docs/charts.md): the agent page's needs and goal charts with their axes, thresholds and
end labels, a value on keyboard focus, a curve moved by a push; the dashboard's glance; pictures at 1366 and 390 px
(with UPDATE_SCREENSHOTS=1 they become docs/charts_*.png)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from playwright.sync_api import Page, expect

from tests.browser.conftest import OPERATOR, VIEWER, Login

ROOT = Path(__file__).resolve().parents[2]
DESKTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}


def picture(page: Page, tmp_path: Path, name: str) -> None:
    """The viewport's picture; with UPDATE_SCREENSHOTS=1 it becomes docs/<name>."""
    shot = tmp_path / name
    page.screenshot(path=str(shot))
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        (ROOT / "docs" / name).write_bytes(shot.read_bytes())


def open_persona(page: Page, name: str) -> None:
    """The persona's page from the dashboard's link, live (the header's dot on), once its charts have samples."""
    page.goto("/")
    page.locator("#agent-rows").get_by_role("link", name=name, exact=True).click()
    expect(page.locator("#live-status")).to_have_class(re.compile(r"\bon\b"))
    expect(page.locator("#needs-chart polyline").first).to_be_attached(timeout=20_000)
    expect(page.locator("#agent-goals svg.line-chart").first).to_be_attached(timeout=20_000)


def test_agent_page_charts_have_axes_thresholds_labels_and_values_on_focus(login: Login, tmp_path: Path) -> None:
    page = login(VIEWER)
    page.set_viewport_size(DESKTOP)
    open_persona(page, "Jenbina")
    needs = page.locator("#needs-chart svg")
    for text in ("0%", "50%", "100%", "urgent below 15%", "latest"):
        expect(needs.locator("text", has_text=text).first).to_be_visible()
    expect(needs.locator("text.end-label", has_text=re.compile(r"^hunger \d+%$"))).to_be_visible()
    goal = page.locator("#agent-goals figure.chart-figure").first
    expect(goal.locator("text.rule-label", has_text=re.compile(r"abandoned below \d+% confidence"))).to_be_visible()
    expect(goal.locator("text.rule-label", has_text="milestone check at 85% progress")).to_be_visible()
    expect(goal.locator("text.end-label", has_text=re.compile(r"^confidence \d+%$"))).to_be_visible()
    box = goal.locator("svg").bounding_box()
    assert box is not None and box["width"] >= 320 and box["height"] >= 150

    # A value on keyboard focus: Tab reaches the latest sample, whose title says the values the end labels say.
    latest = needs.locator("rect.hit[tabindex='0']").last
    latest.focus()
    expect(latest).to_be_focused()
    title = latest.locator("title").text_content() or ""
    hunger = needs.locator("text.end-label", has_text=re.compile(r"^hunger ")).text_content() or ""
    assert "(latest, " in title and hunger in title, (title, hunger)
    latest.hover()
    # The accessible fallback: the same values in a table.
    page.locator("#needs-chart summary").click()
    expect(page.locator("#needs-chart table tbody tr").last).to_contain_text("latest")
    page.locator("#needs-chart summary").click()

    page.locator("#agent-needs").scroll_into_view_if_needed()
    picture(page, tmp_path, "charts_agent.png")
    page.set_viewport_size(PHONE)
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    page.locator("#agent-goals svg.line-chart").first.scroll_into_view_if_needed()
    box = page.locator("#agent-goals svg.line-chart").first.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    picture(page, tmp_path, "charts_agent_phone.png")


def test_a_curve_moves_without_a_reload(login: Login) -> None:
    page = login(VIEWER)
    open_persona(page, "Marco")
    page.evaluate("window.__marker = 1")
    needs = page.locator("#needs-chart svg polyline").first
    before = needs.get_attribute("points")
    expect(needs).not_to_have_attribute("points", before or "", timeout=25_000)  # the runner's next cycles, pushed
    assert page.evaluate("window.__marker") == 1, "the page was reloaded"


def test_dashboard_glance_shows_the_fleet_and_goals_nearest_abandonment(login: Login, tmp_path: Path) -> None:
    page = login(OPERATOR)
    page.set_viewport_size(DESKTOP)
    page.goto("/")
    glance = page.locator("#dashboard-glance")
    expect(glance.locator("svg.bar-strip")).to_be_visible()
    for row in ("new waiting items", "plans made", "decisions taken"):
        expect(glance.locator("text.end-label", has_text=row)).to_be_visible()
    expect(glance.locator("text", has_text="-60 min")).to_be_visible()
    jenbina = glance.locator("li.urgent-goal", has=page.get_by_role("link", name="Jenbina", exact=True))
    expect(jenbina.locator("svg.sparkline")).to_be_visible()
    expect(jenbina).to_contain_text(re.compile(r"confidence \d+% · abandoned below \d+% · about \d+ simulated h of decay left"))
    spark = jenbina.locator("svg.sparkline")
    spark.focus()
    expect(spark).to_be_focused()
    assert re.search(r"\d+% now; abandoned below \d+%", spark.locator("title").text_content() or "")
    picture(page, tmp_path, "charts_dashboard.png")
    page.set_viewport_size(PHONE)
    glance.scroll_into_view_if_needed()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    picture(page, tmp_path, "charts_dashboard_phone.png")
