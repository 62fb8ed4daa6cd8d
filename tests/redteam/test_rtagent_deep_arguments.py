"""Red-team rtagent: arguments nested a few hundred levels deep, sent by an agent to a
live daphne, are refused by name, never answered with an internal error.

The JSON readers take nesting up to Python's recursion limit (a body nested too deeply
for them is answered 400 "nested too deeply"), but what reads the arguments after them
recurses deeper per level: masking the audit copy (audit.masking.mask_secrets, a frame
or two per level, on a request thread already some fifty frames deep) overflowed at
about 500 levels, so the agent API and the hooks answered 500 internal_error (a
traceback in the log) and MCP at 2026-07-28 a JSON-RPC "Internal server error", for a
body each reader had accepted. Nothing was recorded, but the agent (or the model whose
arguments these are) was told to retry what can never pass."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from dispatcher.models import ToolCall
from tests.support.factories import AgentFixture, unique
from tests.support.live import LiveStack

pytestmark = pytest.mark.slow
DEPTH = 900  # (json.loads reads it; the masking's recursion does not)


def _deep() -> str:
    return "[" * DEPTH + "1" + "]" * DEPTH


def test_the_agent_api_refuses_deep_arguments_by_name(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    with live_stack.client(live_agent) as http:
        session = http.post("/api/v1/sessions", json={}).json()["id"]
        body = '{"calls":[{"id":"deep","name":"read_file","arguments":{"path":"a","x":%s}}]}'
        answer = http.post(
            f"/api/v1/sessions/{session}/calls",
            content=body % _deep(),
            headers={"Content-Type": "application/json"},
        )
    assert answer.status_code in (400, 422), answer.text[:300]
    assert "deep" in answer.json()["error"]["message"], answer.text[:300]
    assert not ToolCall.objects.filter(session_id=uuid.UUID(session)).exists()


def test_a_pre_tool_hook_with_deep_input_is_refused_by_name(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    external = unique("cc")
    body = (
        (
            '{"session_id":"SESSION","hook_event_name":"PreToolUse","cwd":"/home/dev/project",'
            '"tool_name":"Bash","tool_use_id":"t-deep","tool_input":{"command":"ls","x":DEEP}}'
        )
        .replace("SESSION", external)
        .replace("DEEP", _deep())
    )
    answer = httpx.post(
        live_stack.url + "/api/v1/hooks/claude-code?wait=0",
        headers={**live_agent.headers, "Content-Type": "application/json"},
        content=body,
        timeout=30,
    )
    assert answer.status_code in (400, 422), answer.text[:300]
    assert "deep" in answer.json()["error"]["message"], answer.text[:300]
    assert not ToolCall.objects.filter(session__external_id=external).exists()


def test_an_mcp_call_with_deep_arguments_is_refused_as_invalid_params(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "deep", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
        "harness/run": unique("run"),
    }
    body = (
        (
            '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"read_file",'
            '"arguments":{"path":"a","x":DEEP},"_meta":META}}'
        )
        .replace("META", json.dumps(meta))
        .replace("DEEP", _deep())
    )
    answer = httpx.post(
        live_stack.url + "/mcp/",
        headers={
            **live_agent.headers,
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call",
            "Mcp-Name": "read_file",
        },
        content=body,
        timeout=30,
    )
    text = answer.text
    data = json.loads(text[text.index("{") :].splitlines()[0]) if "data:" in text else answer.json()
    assert data["error"]["code"] == -32602, text[:300]  # invalid params, saying why
    assert "deep" in data["error"]["message"], text[:300]
