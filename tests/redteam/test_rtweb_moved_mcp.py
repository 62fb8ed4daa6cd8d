"""Red team (rtweb): an MCP client of an agent moved to another team, against a live
Harness (daphne): its Mcp-Session-Id of the former team's session, the same run key
(`harness/run`) initialized again, and a sessionless call with the same client title
within the idle window. Each lands in a session of the new team; none joins the former
team's session or reads its tools."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from dispatcher import agents
from dispatcher.models import AgentSession, ToolCall
from tests.support import mcp_requests
from tests.support.factories import AgentFixture
from tests.support.live import LiveStack
from tests.teams.world import make_team

pytestmark = pytest.mark.live


def _post(stack: LiveStack, fx: AgentFixture, body: Any, session: str = "") -> httpx.Response:
    headers = {
        "Authorization": f"Bearer {fx.token}",
        "Accept": "application/json, text/event-stream",
    }
    if session:
        headers["Mcp-Session-Id"] = session
    return httpx.post(stack.url + "/mcp/", json=body, headers=headers, timeout=60)


def _names(stack: LiveStack, fx: AgentFixture, session: str) -> set[str]:
    """Every tool the session is offered (tools/list, page by page)."""
    names: set[str] = set()
    cursor = None
    seen: set[str] = set()
    for n in range(100, 2100):  # (the run's other tests register tools too: many pages)
        params: dict[str, Any] = {"cursor": cursor} if cursor else {}
        body = {"jsonrpc": "2.0", "id": n, "method": "tools/list", "params": params}
        answer = _post(stack, fx, body, session)
        assert answer.status_code == 200, answer.text
        data = json.loads(answer.text.split("data: ", 1)[1].split("\r\n", 1)[0])
        names |= {tool["name"] for tool in data["result"]["tools"]}
        cursor = data["result"].get("nextCursor")
        if not cursor:
            return names
        assert cursor not in seen, f"tools/list came back to the cursor {cursor!r}"
        seen.add(cursor)
    raise AssertionError("tools/list did not end")


def _call(n: int, name: str, arguments: dict[str, Any], run: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"io.modelcontextprotocol/clientInfo": {"name": "cli", "version": "1"}}
    if run:
        meta["harness/run"] = run
    return {
        "jsonrpc": "2.0",
        "id": n,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments, "_meta": meta},
    }


def test_an_mcp_client_of_a_moved_agent_starts_over_in_its_new_team(
    live_stack: LiveStack, live_db: None
) -> None:
    pay, infra = make_team("pay"), make_team("infra")
    fx = pay.agent
    opened = _post(live_stack, fx, mcp_requests.initialize("cli", run="r1"))
    assert opened.status_code == 200, opened.text
    header = opened.headers["mcp-session-id"]
    [former] = AgentSession.objects.filter(agent=fx.agent, client="mcp")
    assert former.team_id == pay.team.pk
    assert pay.tool.exposed_name in _names(live_stack, fx, header)

    assert agents.transfer_agent(agent=fx.agent, team=infra.team, actor="test")

    # The former session's id: not found (initialize again), nothing admitted into it.
    stale = _post(live_stack, fx, _call(2, "read_file", {"path": "a.txt"}), header)
    assert stale.status_code == 404, stale.text
    listed = _post(live_stack, fx, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, header)
    assert listed.status_code == 404, listed.text
    assert not ToolCall.objects.filter(session=former).exists()
    # The same run key initialized again: a new session of the new team.
    again = _post(live_stack, fx, mcp_requests.initialize("cli", run="r1", request_id=4))
    assert again.status_code == 200, again.text
    renewed = again.headers["mcp-session-id"]
    session = AgentSession.objects.exclude(pk=former.pk).get(agent=fx.agent, client="mcp")
    assert session.team_id == infra.team.pk
    # (The same run key names the new session: its id is the former one's, now the new
    # team's session, as the unique key is the agent, team, client and id.)
    assert renewed.split("~")[0] == session.external_id == former.external_id
    offered = _names(live_stack, fx, renewed)
    assert pay.tool.exposed_name not in offered and infra.tool.exposed_name in offered
    # A sessionless call of the same run, and one of the same client title: the new one.
    for n, run in ((6, "r1"), (7, "")):
        answer = _post(live_stack, fx, _call(n, "read_file", {"path": "a.txt"}, run))
        assert answer.status_code == 200, answer.text
    assert not ToolCall.objects.filter(session=former).exists()
    assert set(
        ToolCall.objects.filter(session__agent=fx.agent, session__client="mcp").values_list(
            "session__team_id", flat=True
        )
    ) == {infra.team.pk}
