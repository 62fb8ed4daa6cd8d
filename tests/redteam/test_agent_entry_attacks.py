"""Red-team of the agent-facing entry points (the agent API, the coding agents' hooks, the
MCP gateway) against a real daphne: bad input is answered with a clear, specific error
and loses nothing. Each test is an attack; it passes when the attack fails.

- A tool's output with a NUL character (`printf '\\0'`, a binary file read) made its hook
  report 422, so the report was lost and what the tool returned never reached the audit:
  an agent could hide a tool's output that way. Reports and session events are kept,
  their text made storable; the pre-tool input is still refused, being what is decided.
- A number too large for a float (1e400: valid JSON, read as infinity) passed the strict
  read and failed at the database: a generic 422 on the API and the hooks, and on MCP a
  -32603 "could not record, send it again later" that no retry could ever pass.
- An MCP request whose id is null, 1.5 or true was read as a notification: 202, nothing
  run, and the client left waiting for an answer that never comes.
- harness-hook set up without its --agent (Gemini CLI's BeforeTool sent to the Claude Code
  hook, or Claude Code's PreToolUse to `--agent gemini`) posted an event that endpoint does
  not ask about, was answered `{}` and exited 0: the agent ran the tool unasked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from dispatcher.models import AgentSession, Status, ToolCall
from tests.support.factories import AgentFixture, unique
from tests.support.live import LiveStack

pytestmark = pytest.mark.slow

MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": "2025-06-18",
}


def hook(stack: LiveStack, fx: AgentFixture, body: dict[str, Any] | bytes) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        stack.url + "/api/v1/hooks/claude-code?wait=0",
        headers={**fx.headers, "Content-Type": "application/json"},
        content=content,
        timeout=30,
    )


def read_hook(session: str, **extra: Any) -> dict[str, Any]:
    return {
        "session_id": session,
        "cwd": "/home/dev/project",
        "hook_event_name": "PreToolUse",
        "tool_name": "Read",
        "tool_input": {"file_path": "/home/dev/project/a.bin"},
        "tool_use_id": "toolu_read",
        **extra,
    }


def mcp_post(stack: LiveStack, fx: AgentFixture, session: str, payload: bytes) -> httpx.Response:
    headers = {**fx.headers, **MCP_HEADERS, "Mcp-Session-Id": session}
    return httpx.post(stack.url + "/mcp/", headers=headers, content=payload, timeout=30)


def test_a_report_of_output_with_a_nul_is_recorded_not_refused(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    session = unique("nul")
    allowed = hook(live_stack, live_agent, read_hook(session))
    assert allowed.json()["hookSpecificOutput"]["permissionDecision"] == "allow"

    # The model had the tool return a NUL (and a lone surrogate, as Node escapes one).
    output = json.dumps({"file": {"content": "secret\u0000 after"}, "note": "x"})
    output = output.replace('"x"', '"\\ud800"')
    report = json.dumps(read_hook(session, hook_event_name="PostToolUse")).encode()
    report = report[:-1] + b', "tool_response": ' + output.encode() + b"}"
    answered = hook(live_stack, live_agent, report)

    assert answered.status_code == 200, answered.text
    call = ToolCall.objects.get(session__external_id=session, tool_use_id="toolu_read")
    assert call.status == Status.REPORTED
    assert "secret\ufffd after" in call.content and "\ufffd" in call.content

    prompt = read_hook(session, hook_event_name="UserPromptSubmit", prompt="hi\u0000there")
    assert hook(live_stack, live_agent, prompt).status_code == 200


def test_a_pre_tool_input_with_a_nul_is_still_refused(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    session = unique("nulpre")
    body = read_hook(session, tool_input={"file_path": "/home/dev/project/a\u0000b"})
    refused = hook(live_stack, live_agent, body)

    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "unstorable_json"
    assert not ToolCall.objects.filter(session__external_id=session).exists()


def test_a_number_too_large_is_refused_by_name_on_every_entry(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    with live_stack.client(live_agent) as client:
        started = client.post("/api/v1/sessions", json={"title": "huge"}).json()
        body = b'{"calls": [{"id": "big", "name": "read_file", "arguments": {"n": 1e400}}]}'
        submitted = client.post(f"/api/v1/sessions/{started['id']}/calls", content=body)
    assert submitted.status_code == 422
    assert submitted.json()["error"]["code"] == "unstorable_json"
    assert "too large" in submitted.json()["error"]["message"]

    session = unique("huge")
    pre = json.dumps(read_hook(session, tool_input={"file_path": "x", "limit": 7}))
    hooked = hook(live_stack, live_agent, pre.replace("7", "1e400").encode())
    assert hooked.status_code == 422
    assert hooked.json()["error"]["code"] == "unstorable_json"

    mcp_session = live_stack.mcp_session(live_agent, "rt-huge")
    payload = (
        b'{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": '
        b'"read_file", "arguments": {"path": "a", "n": 1e400}}}'
    )
    answered = mcp_post(live_stack, live_agent, mcp_session, payload)
    error = json.loads(answered.text.split("data: ")[-1])["error"]
    # Invalid params, saying why: not "could not record, send it again later".
    assert error["code"] == -32602 and "too large" in error["message"]
    assert not ToolCall.objects.filter(session__external_id=mcp_session.split("~")[0]).exists()


@pytest.mark.parametrize("request_id", [None, 1.5, True, {"a": 1}])
def test_an_mcp_request_with_an_id_no_request_has_is_answered(
    live_stack: LiveStack, live_agent: AgentFixture, request_id: Any
) -> None:
    session = live_stack.mcp_session(live_agent, "rt-ids")
    message = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "read_file", "arguments": {"path": "a"}},
    }
    answered = mcp_post(live_stack, live_agent, session, json.dumps(message).encode())

    assert answered.status_code == 400, answered.text
    body = answered.json()
    assert body["id"] is None and body["error"]["code"] == -32600
    assert "string or an integer" in body["error"]["message"]
    harness_session = AgentSession.objects.get(external_id=session)
    assert not harness_session.calls.exists()


def test_a_notification_sent_with_an_id_is_still_a_notification(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    session = live_stack.mcp_session(live_agent, "rt-note")
    message = {"jsonrpc": "2.0", "id": None, "method": "notifications/initialized"}
    answered = mcp_post(live_stack, live_agent, session, json.dumps(message).encode())

    assert answered.status_code == 202


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"{", id="not-json"),
        pytest.param(b'[{"jsonrpc": "2.0", "id": 1, "method": "initialize"}]', id="batch"),
        pytest.param(b"[" * 5000 + b"]" * 5000, id="deep"),
        pytest.param(b'{"id": 1}', id="no-method"),
    ],
)
def test_an_unreadable_body_without_a_session_is_named_as_such(
    live_stack: LiveStack, live_agent: AgentFixture, payload: bytes
) -> None:
    """Not "no Mcp-Session-Id header and no request: send an initialize", which a client
    that sent one (malformed) cannot act on."""
    headers = {**live_agent.headers, **MCP_HEADERS}
    answered = httpx.post(live_stack.url + "/mcp/", headers=headers, content=payload, timeout=30)

    assert answered.status_code == 400
    assert answered.json()["error"]["code"] == "unreadable_message"


HOOK = Path(__file__).resolve().parents[2] / "dispatcher" / "gateways" / "hook_command.py"


@pytest.mark.parametrize(
    "event, tool, arguments",
    [
        pytest.param("BeforeTool", "run_shell_command", [], id="gemini-input-default-hook"),
        pytest.param("PreToolUse", "Bash", ["--agent", "gemini"], id="claude-input-gemini-hook"),
    ],
)
def test_a_hook_set_up_for_another_agent_blocks(
    live_stack: LiveStack, live_agent: AgentFixture, event: str, tool: str, arguments: list[str]
) -> None:
    hook_input = {
        "session_id": unique("wrong-agent"),
        "cwd": "/home/dev/project",
        "hook_event_name": event,
        "tool_name": tool,
        "tool_input": {"command": "rm -rf build"},
        "tool_use_id": "toolu_rm",
    }
    env = {
        "PATH": "/usr/bin:/bin",
        "HARNESS_URL": live_stack.url,
        "HARNESS_TOKEN": live_agent.token,
    }
    ran = subprocess.run(  # noqa: S603 - this repository's hook, as a developer runs it
        [sys.executable, "-I", "-S", str(HOOK), *arguments],
        input=json.dumps(hook_input),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert ran.returncode == 2, (ran.stdout, ran.stderr)
    assert ran.stdout == ""
    assert "--agent" in ran.stderr
