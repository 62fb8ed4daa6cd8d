"""Every dashboard page in Chromium at a laptop's and a phone's width, under the CSP:
nothing blocked, nothing wider than the screen, and a screenshot of each.

Screenshots go to a temporary directory, or to HARNESS_SCREENSHOT_DIR (docs/img/ when
the documentation's pictures are refreshed: `HARNESS_SCREENSHOT_DIR=docs/img make
test-pg PYTEST_ARGS=tests/dashboard/test_browser.py`); the timeline's come from a real
demo run instead (`make screenshots`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from playwright.sync_api import expect

from tests.support.browser import login
from tests.support.factories import make_user, unique
from tests.support.live import LiveStack

pytestmark = [pytest.mark.browser, pytest.mark.live]

WIDTHS = {"desktop": (1366, 900), "phone": (390, 844)}


class Visitor:
    """A signed-in admin (all roles) in one browser context of a given width."""

    def __init__(self, browser: Any, stack: LiveStack, width: int, height: int) -> None:
        self.username = unique("admin")
        make_user(self.username, groups=("admin", "reviewer", "auditor"))
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=stack.url)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.stack = stack
        login(self.page, stack.url, self.username)

    def open(self, path: str) -> Any:
        self.page.goto(self.stack.url + path)
        self.page.wait_for_load_state("networkidle")
        return self.page

    def check(self, shots: Path, name: str, width: int) -> None:
        """No CSP report or script error, no sideways scrolling, and a screenshot."""
        blocked = [e for e in self.errors if "Content Security Policy" in e or "Refused" in e]
        assert not blocked, blocked
        assert not [e for e in self.errors if "Uncaught" in e], self.errors
        overflow = self.page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 1, f"{name} is {overflow}px wider than a {width}px screen"
        self.page.screenshot(path=str(shots / f"{name}-{width}.png"), full_page=True)


@pytest.fixture(params=list(WIDTHS))
def visitor(
    request: Any, browser: Any, live_stack: LiveStack, live_db: None
) -> Iterator[tuple[Visitor, int]]:
    width, height = WIDTHS[request.param]
    v = Visitor(browser, live_stack, width, height)
    yield v, width
    v.context.close()
    connection.close()


def test_overview(
    visitor: tuple[Visitor, int], dashboard_data: dict[str, Any], shots: Path
) -> None:
    v, width = visitor
    page = v.open("/")
    assert page.locator("h1").inner_text() == "Overview"
    assert page.locator("svg.chart-svg").count() == 3
    assert page.locator("svg.chart-svg rect").count() > 20
    assert page.locator(".sr-only table caption").first.inner_text().startswith("Calls per hour")
    assert int(page.locator(".tile .big").nth(1).inner_text()) >= 1500
    v.check(shots, "overview", width)


def test_timeline(
    visitor: tuple[Visitor, int], dashboard_data: dict[str, Any], tmp_path: Path
) -> None:
    """Its pictures stay out of docs/img: `make screenshots` takes those from a real demo
    run (tests/dashboard/screenshots.py), not from this made-up session."""
    v, width = visitor
    shots = tmp_path
    page = v.open(f"/audit/sessions/{dashboard_data['chain']}/")
    lines = page.locator("article.audit-call")
    assert lines.count() == 4
    page.locator("#live-state.on").wait_for(timeout=5000)  # the socket is open
    v.check(shots, "timeline", width)
    lines.nth(1).locator("summary").click()  # opens in place: what the reviewer saw
    assert lines.nth(1).locator("pre.diff .add").first.is_visible()
    page.select_option("select[name=outcome]", "denied")
    expect(page.locator("article.audit-call")).to_have_count(1)
    assert "outcome=denied" in page.url
    page.go_back()
    expect(page.locator("article.audit-call")).to_have_count(4)
    page.locator("#live-state.on").wait_for(timeout=5000)  # live again after the restore
    lines.nth(1).locator("summary").click()
    v.check(shots, "timeline-open", width)


def test_agents(visitor: tuple[Visitor, int], dashboard_data: dict[str, Any], shots: Path) -> None:
    v, width = visitor
    page = v.open("/agents/")
    assert page.locator("table.agents-table tbody tr").count() >= 3
    v.check(shots, "agents", width)
    page.fill("input[name=name]", unique("ci-bot"))
    page.click("text=Create agent")
    page.wait_for_selector("#agent-token")
    token = page.locator("#agent-token").input_value()
    assert token.startswith("hrn_")
    page.locator(".token-once button[data-copy]").click()
    page.locator(".token-once .copy-state", has_text="Copied").wait_for(timeout=5000)
    assert page.evaluate("navigator.clipboard.readText()") == token
    assert "claude mcp add --transport http harness" in page.locator("#snippet-mcp").inner_text()
    v.check(shots, "agent-created", width)


def test_rules_editor(
    visitor: tuple[Visitor, int], dashboard_data: dict[str, Any], shots: Path
) -> None:
    v, width = visitor
    page = v.open(f"/permissions/users/{dashboard_data['owner'].pk}/")
    rows = page.locator("#rule-rows fieldset.rule-row").count()
    row = page.locator("#rule-rows fieldset.rule-row").last
    row.locator("select.rule-tool").select_option("run_command")
    row.locator("input.rule-spec").fill("npm test *")
    page.click("#add-rule")
    expect(page.locator("#rule-rows fieldset.rule-row")).to_have_count(rows + 1)
    bad = page.locator("#rule-rows fieldset.rule-row").last
    bad.locator("select.rule-action").select_option("deny")
    bad.locator("select.rule-tool").select_option("run_command")
    bad.locator("input.rule-spec").fill("rm (-rf")
    bad.locator(".rule-check .bad").wait_for(timeout=5000)  # named before any save
    v.check(shots, "rules-editor-check", width)
    bad.locator("input.rule-spec").fill("rm -rf *")
    expect(bad.locator(".rule-check .bad")).to_have_count(0)
    page.click("#run-backtest")
    page.locator(".backtest-summary").wait_for(timeout=10000)
    assert "would change" in page.locator(".backtest-summary").inner_text()
    v.check(shots, "rules-editor", width)


def test_analytics(
    visitor: tuple[Visitor, int], dashboard_data: dict[str, Any], shots: Path
) -> None:
    v, width = visitor
    page = v.open("/permissions/analytics/")
    assert page.locator("code.suggested-rule", has_text="run_command(npm test *)").count() == 1
    assert page.locator("table.reviewers tr.flagged").count() >= 1
    v.check(shots, "analytics", width)
