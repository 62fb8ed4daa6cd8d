"""An MCP client's call of an upstream tool, asked and approved in a reviewer's browser."""

from __future__ import annotations

import sys
import threading
import uuid
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from mcp import types

from tests.approvals.test_browser import Reviewer
from tests.mcp.conftest import mcp_session, run, text_of
from tests.support.factories import AgentFixture
from tests.support.live import LiveStack
from tests.support.paths import ROOT

pytestmark = [pytest.mark.browser, pytest.mark.live]


def test_an_upstream_call_asked_over_mcp_is_approved_in_the_browser(
    browser: Any, live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    name = "b" + uuid.uuid4().hex[:8]
    command = f"{sys.executable} {ROOT / 'tests' / 'support' / 'mcp_upstream.py'} stdio"
    call_command("add_mcp_server", name, "--command", command, stdout=StringIO())
    reviewer = Reviewer(browser, live_stack)
    path = f"notes/{name}.md"
    notes: list[str] = []
    outcome: list[types.CallToolResult] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(message or "")

    async def scenario() -> None:
        async with mcp_session(live_stack, live_agent) as (session, _):
            outcome.append(
                await session.call_tool(
                    f"{name}__write_note",
                    {"path": path, "text": "approved in a browser"},
                    progress_callback=on_progress,
                )
            )

    agent = threading.Thread(target=lambda: run(scenario), daemon=True)
    agent.start()
    try:
        item = reviewer.item(path)
        item.wait_for(timeout=10000)  # pushed live: the untrusted upstream tool asks
        assert f"{name}__write_note" in item.inner_text()
        item.get_by_role("button", name="Approve").first.click()
        agent.join(30)
        assert outcome, "the MCP call did not return"
        assert (outcome[0].is_error, text_of(outcome[0])) == (
            False,
            f"noted 21 characters for {path}",
        )
        assert notes and "Waiting for a reviewer" in notes[0]
        page = reviewer.page.goto(notes[0].rsplit(" ", 1)[-1])  # the page progress named
        assert page is not None and page.status == 200
        assert path in reviewer.page.locator("article.approval").inner_text()
    finally:
        reviewer.context.close()
