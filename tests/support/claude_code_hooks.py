"""Helpers for the Claude Code tests: hook input as Claude Code 2.1.328 sends it."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.test import Client

from tests.support.factories import AgentFixture

PROJECT = "/home/dev/project"
HOOK_URL = "/api/v1/hooks/claude-code"


def hook_input(event: str, session_id: str, cwd: str = PROJECT, **fields: Any) -> dict[str, Any]:
    """A hook input with the fields Claude Code sends (measured), plus `fields`."""
    body: dict[str, Any] = {
        "session_id": session_id,
        "transcript_path": f"/home/dev/.claude/projects/-home-dev-project/{session_id}.jsonl",
        "cwd": cwd,
        "prompt_id": str(uuid.uuid4()),
        "permission_mode": "default",
        "effort": {"level": "medium"},
        "hook_event_name": event,
    }
    body.update(fields)
    return body


def pre_tool_use(
    session_id: str, tool: str, tool_input: dict[str, Any], tool_use_id: str | None = None, **f: Any
) -> dict[str, Any]:
    return hook_input(
        "PreToolUse",
        session_id,
        tool_name=tool,
        tool_input=tool_input,
        tool_use_id=tool_use_id or "toolu_" + uuid.uuid4().hex[:24],
        **f,
    )


def send(fx: AgentFixture | None, body: Any, wait: float = 0, client: Client | None = None) -> Any:
    """POST a hook input (a dict, or raw text) with the agent's token; the response."""
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    headers = fx.headers if fx is not None else {}
    return (client or Client()).post(
        f"{HOOK_URL}?wait={wait}", data=data, content_type="application/json", headers=headers
    )


def decision(response: Any) -> tuple[str, str]:
    """(permissionDecision, permissionDecisionReason) of a PreToolUse answer."""
    assert response.status_code == 200, response.content
    output = response.json()["hookSpecificOutput"]
    assert output["hookEventName"] == "PreToolUse"
    assert "updatedInput" not in output
    return output["permissionDecision"], output["permissionDecisionReason"]
