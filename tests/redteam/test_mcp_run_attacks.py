"""Red-team attacks on MCP sessions that follow the run (dispatcher/gateways/mcp_http.py
session_for, dispatcher/agents.py join_run), against a live Harness: another agent's
Mcp-Session-Id (whole, or with a `~` transport part of its own), its client title within
the idle window, and request ids that collide."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from dispatcher import agents
from dispatcher.models import AgentSession, ToolCall
from tests.support import mcp_requests
from tests.support.factories import AgentFixture, make_agent
from tests.support.live import LiveStack

pytestmark = pytest.mark.live

INFO = {"io.modelcontextprotocol/clientInfo": {"name": "bare", "version": "1"}}


def post(
    stack: LiveStack, fx: AgentFixture, body: dict[str, Any], session: str = ""
) -> httpx.Response:
    headers = {
        "Authorization": f"Bearer {fx.token}",
        "Accept": "application/json, text/event-stream",
    }
    if session:
        headers["Mcp-Session-Id"] = session
    return httpx.post(stack.url + "/mcp/", json=body, headers=headers, timeout=60)


def call(n: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": n,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments, "_meta": INFO},
    }


def test_another_agents_run_is_not_joined_by_session_id_transport_part_or_title(
    live_stack: LiveStack, live_db: None
) -> None:
    victim, thief = make_agent(mode="trusted"), make_agent(mode="trusted")
    assert post(live_stack, victim, call(1, "write_file", {"path": "s.txt", "content": "k"}))
    [run] = AgentSession.objects.filter(agent=victim.agent, client="mcp")
    # A transport session joining the victim's run gets "<external>~<part>".
    joined = post(live_stack, victim, mcp_requests.initialize("bare", request_id=2))
    assert joined.status_code == 200, joined.text
    header = joined.headers["mcp-session-id"]
    assert header.startswith(run.external_id + "~")
    # The thief sends the victim's ids, whole and with a transport part of its own.
    for session in (run.external_id, header, run.external_id + "~x", run.external_id + "~"):
        answer = post(live_stack, thief, call(1, "read_file", {"path": "s.txt"}), session)
        assert answer.status_code == 404, (session, answer.text)
    # Sessionless, with the victim's client title, within the idle window: its own run.
    answer = post(live_stack, thief, call(1, "read_file", {"path": "s.txt"}))
    assert answer.status_code == 200 and "does not exist" in answer.text, answer.text
    [own] = AgentSession.objects.filter(agent=thief.agent, client="mcp")
    assert own.pk != run.pk and own.workspace != run.workspace
    # Both agents used request id 1: two calls, each in its own agent's session.
    ones = ToolCall.objects.filter(tool_use_id__endswith=":1", session__in=[run, own])
    assert {c.session_id for c in ones} == {run.pk, own.pk}
    assert Path(run.workspace, "s.txt").read_text() == "k"
    # A revoked agent's session id no longer answers for anyone.
    agents.revoke_agent(agent=victim.agent, actor="test")
    answer = post(live_stack, victim, call(3, "read_file", {"path": "s.txt"}), run.external_id)
    assert answer.status_code == 401
