"""Every dashboard page on a 390 px phone, with realistic data (sessions with calls, a
pending ask, rules, a session grant, the tools): no page scrolls sideways. Wide tables
become cards or scroll inside their own box (static/harness.css)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from approvals.models import ApprovalRequest
from dispatcher.models import AgentSession
from dispatcher.policy import profiles
from dispatcher.policy.models import SessionGrant
from dispatcher.tools.sources.models import McpServer, McpTool, ServerVersion
from tests.dashboard.test_browser import Visitor
from tests.support.factories import make_agent, unique
from tests.support.live import LiveStack

pytestmark = [pytest.mark.browser, pytest.mark.live]


PHONE = (390, 844)
RULES = {
    "mode": "standard",
    "allow": ["run_command(npm test *)", "read_file(src/**)", "write_file(docs/**/*.md)"],
    "ask": ["run_command(git push origin feature/a-very-long-branch-name-for-a-phone *)"],
    "deny": ["read_file(**/.env)", "run_command(rm -rf *)", "write_file(secrets/**)"],
}


@pytest.fixture(scope="module")
def pages(
    live_stack: LiveStack, django_db_blocker: Any, dashboard_data: dict[str, Any]
) -> Iterator[list[str]]:
    """Every dashboard page's path, after an agent's real calls (one asks) and rules."""
    with django_db_blocker.unblock():
        fx = make_agent(mode="standard")
        profiles.set_rules(user=fx.owner, document=RULES, actor="system")
        with live_stack.client(fx) as agent:
            session = agent.post("/api/v1/sessions", json={"title": "a phone's view"}).json()
            calls = [
                {"id": "r1", "name": "read_file", "arguments": {"path": "README.md"}},
                {
                    "id": "w1",
                    "name": "write_file",
                    "arguments": {
                        "path": "src/a/rather/long/path/for/a/phone/notes.txt",
                        "content": "x\n",
                    },
                },
                {"id": "n1", "name": "no_such_tool", "arguments": {}},
            ]
            response = agent.post(f"/api/v1/sessions/{session['id']}/calls", json={"calls": calls})
            assert response.status_code in (200, 202), response.text
        approval = ApprovalRequest.objects.filter(call__session_id=session["id"]).first()
        assert approval is not None, "the write did not ask"
        SessionGrant.objects.create(
            session=AgentSession.objects.get(pk=session["id"]),
            rule="run_command(npm test *)",
            tool="run_command",
            granted_by=fx.owner,
        )
        server = upstream_server()
        chain = dashboard_data["chain"]
        owner: User = dashboard_data["owner"]
        connection.close()
    yield [
        "/",
        "/approvals/",
        f"/approvals/{approval.pk}/",
        "/approvals/notifications/",
        "/audit/sessions/",
        f"/audit/sessions/{chain}/",
        f"/audit/sessions/{chain}/replay/",
        f"/audit/sessions/{chain}/transcript/",
        f"/audit/sessions/{session['id']}/",
        "/permissions/",
        "/permissions/analytics/",
        f"/permissions/users/{owner.pk}/",
        f"/permissions/users/{fx.owner.pk}/",
        f"/permissions/sessions/{session['id']}/",
        "/agents/",
        f"/agents/{fx.agent.pk}/",
        "/tools/",
        f"/tools/review/{server.tools.get(state='new').exposed_name}/",
    ]
    with django_db_blocker.unblock():
        server.delete()  # its held tools are offered to nobody, but leave no server behind
        connection.close()


def upstream_server() -> McpServer:
    """An MCP server as /tools/ lists one after a while: a long command line, tools held
    for review and missing, and its changes. Only held and missing tools: other live
    tests see no new tool offered."""
    name = unique("files")[:32]
    server = McpServer.objects.create(
        name=name,
        transport="stdio",
        command=["npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv/share/projects"],
        env={"FILESYSTEM_ROOT": "/srv/share"},
        created_by="admin",
    )
    schema = {"type": "object", "properties": {"path": {"type": "string"}}}
    for tool, state in (("read_text_file", "new"), ("list_allowed_directories", "missing")):
        McpTool.objects.create(
            server=server,
            name=tool,
            exposed_name=f"{name}__{tool}",
            state=state,
            description=f"{tool} in the shared directory, as the upstream server describes it.",
            input_schema=schema,
            seen_description="The same tool, described otherwise by a later version upstream.",
            seen_input_schema=schema,
            fingerprint="f" * 64,
            seen_fingerprint="e" * 64,
        )
    for version, change in ((1, "registered"), (2, "tools_changed")):
        ServerVersion.objects.create(
            server_name=name, version=version, change=change, actor="user:admin-with-a-long-name"
        )
    return server


def test_no_page_scrolls_sideways_on_a_phone(
    browser: Any, live_stack: LiveStack, live_db: None, pages: list[str], shots: Path
) -> None:
    visitor = Visitor(browser, live_stack, *PHONE)
    wide = {}
    try:
        for path in pages:
            page = visitor.open(path)
            assert page.locator("main").count() == 1, f"{path} did not render"
            width = page.evaluate("document.documentElement.scrollWidth")
            if width > PHONE[0]:
                wide[path] = width
            name = "-".join(part[:12] for part in path.strip("/").split("/")) or "overview"
            page.screenshot(path=str(shots / f"phone-{name}.png"), full_page=True)
    finally:
        visitor.context.close()
    assert not wide, f"pages wider than a {PHONE[0]} px phone: {wide}"
