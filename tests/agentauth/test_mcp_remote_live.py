"""mcp-remote (pinned, `make mcp-servers`) through its own OAuth sign-in to a live Harness,
headless: it prints the authorization URL (no browser here), a signed-in person consents
over HTTP, the browser's redirect reaches mcp-remote's loopback callback, and the official
MCP client then lists and calls tools through mcp-remote's stdio bridge. Its client is
named by a Client ID Metadata Document on another loopback port."""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from agentauth.models import AgentClient
from tests.mcp.conftest import run, text_of
from tests.support.factories import unique
from tests.support.live import free_port
from tests.support.oauth_live import OAuthStack, Person, team_member
from tests.support.paths import ROOT

pytestmark = [pytest.mark.live, pytest.mark.client_program]
MCP_REMOTE = ROOT / "var" / "mcp-remote" / "node_modules" / "mcp-remote" / "dist" / "proxy.js"


def needs_mcp_remote() -> None:
    if MCP_REMOTE.exists() and shutil.which("node"):
        return
    message = "mcp-remote is not installed: run `make mcp-servers` (needs node and npm)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def test_mcp_remote_signs_in_through_consent_and_calls_tools(
    oauth_stack: OAuthStack, live_db: None, tmp_path: Path
) -> None:
    needs_mcp_remote()
    owner = team_member()
    person = Person(oauth_stack.url, owner.username, "pw-" + owner.username)
    port = free_port()
    callback = f"http://localhost:{port}/oauth/callback"
    client_id = oauth_stack.documents.client(
        f"/{unique('remote')}/client.json", [callback], name="mcp-remote (test)"
    )
    log = tmp_path / "mcp-remote.log"
    errlog = log.open("w")
    approved = threading.Event()

    def browser() -> None:
        """What a person's browser does with the URL mcp-remote prints."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = re.search(r"Please authorize this client by visiting:\s*(\S+)", log.read_text())
            if found:
                back_to = person.consent(found.group(1))
                httpx.get(back_to, timeout=30)  # the redirect lands on mcp-remote's callback
                approved.set()
                return
            time.sleep(0.1)

    params = StdioServerParameters(
        command="node",
        args=[
            str(MCP_REMOTE),
            oauth_stack.url + "/mcp/",
            str(port),
            "--client-metadata-url",
            client_id,
            "--transport",
            "http-only",
        ],
        env={**os.environ, "MCP_REMOTE_CONFIG_DIR": str(tmp_path / "mcp-auth"), "BROWSER": "false"},
    )

    async def scenario() -> tuple[list[str], str]:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            tools = [t.name for t in (await session.list_tools()).tools]
            result = await session.call_tool("list_directory", {"path": "."})
            return tools, text_of(result)

    helper = threading.Thread(target=browser, daemon=True)
    helper.start()
    try:
        tools, _listing = run(scenario, timeout=120)
    finally:
        errlog.close()
    assert approved.is_set(), log.read_text()[-3000:]
    assert "list_directory" in tools
    link = AgentClient.objects.select_related("agent", "application").get(owner=owner)
    assert link.application.client_id == client_id and link.registered_via == "cimd"
    # (mcp-remote opens an MCP session of its own to connect, then forwards ours.)
    calls = [c.name for s in link.agent.sessions.all() for c in s.calls.all()]
    assert calls == ["list_directory"]
