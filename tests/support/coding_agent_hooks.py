"""Helpers for the Codex CLI and Gemini CLI tests: hook input as each CLI sends it
(measured with @openai/codex 0.171.0 and read from @google/gemini-cli 0.61.0's source)."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from django.test import Client

from tests.support.factories import AgentFixture

PROJECT = "/home/dev/project"
CODEX_URL = "/api/v1/hooks/codex"
GEMINI_URL = "/api/v1/hooks/gemini"


def sid() -> str:
    return str(uuid.uuid4())


def codex_input(event: str, session_id: str, cwd: str = PROJECT, **fields: Any) -> dict[str, Any]:
    """A Codex hook input with the fields Codex 0.171.0 sends (measured), plus `fields`."""
    body: dict[str, Any] = {
        "session_id": session_id,
        "turn_id": str(uuid.uuid4()),
        "transcript_path": f"/home/dev/.codex/sessions/rollout-{session_id}.jsonl",
        "cwd": cwd,
        "hook_event_name": event,
        "model": "gpt-5.5",
        "permission_mode": "default",
    }
    body.update(fields)
    return body


def codex_tool(
    session_id: str, tool: str, command: str, event: str = "PreToolUse", **fields: Any
) -> dict[str, Any]:
    """Bash and apply_patch carry their text in tool_input.command, as Codex sends them."""
    return codex_input(
        event,
        session_id,
        tool_name=tool,
        tool_input={"command": command},
        tool_use_id=fields.pop("tool_use_id", "call_" + uuid.uuid4().hex[:24]),
        **fields,
    )


def gemini_input(event: str, session_id: str, cwd: str = PROJECT, **fields: Any) -> dict[str, Any]:
    """A Gemini CLI hook input (its base fields: no tool call id), plus `fields`."""
    body: dict[str, Any] = {
        "session_id": session_id,
        "transcript_path": f"/home/dev/.gemini/tmp/chats/session-{session_id}.json",
        "cwd": cwd,
        "hook_event_name": event,
        "timestamp": "2026-12-01T12:00:00.000Z",
    }
    body.update(fields)
    return body


def gemini_tool(
    session_id: str, tool: str, tool_input: dict[str, Any], event: str = "BeforeTool", **f: Any
) -> dict[str, Any]:
    return gemini_input(event, session_id, tool_name=tool, tool_input=tool_input, **f)


def gemini_shell(session_id: str, command: str, **tool_input: Any) -> dict[str, Any]:
    """A run_shell_command call (Gemini CLI's shell; `description` and `dir_path` optional)."""
    return gemini_tool(session_id, "run_shell_command", {"command": command, **tool_input})


def post(url: str, fx: AgentFixture | None, body: Any, wait: float = 0) -> Any:
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    headers = fx.headers if fx is not None else {}
    return Client().post(
        f"{url}?wait={wait}", data=data, content_type="application/json", headers=headers
    )


def codex_decision(response: Any) -> tuple[str, str]:
    """("allow", the systemMessage) or ("deny", the reason) of a Codex PreToolUse answer,
    checked to be exactly a shape Codex 0.171.0 obeys."""
    assert response.status_code == 200, response.content
    answer = response.json()
    if set(answer) == {"systemMessage"}:
        return "allow", answer["systemMessage"]
    assert set(answer) == {"hookSpecificOutput"}, answer
    output = answer["hookSpecificOutput"]
    assert set(output) == {"hookEventName", "permissionDecision", "permissionDecisionReason"}
    assert (output["hookEventName"], output["permissionDecision"]) == ("PreToolUse", "deny")
    return "deny", output["permissionDecisionReason"]


def gemini_decision(response: Any) -> tuple[str, str]:
    assert response.status_code == 200, response.content
    answer = response.json()
    assert set(answer) == {"decision", "reason"}, answer  # never a changed tool_input
    assert answer["decision"] in ("allow", "deny")
    return answer["decision"], answer["reason"]


HOOK_SCRIPTS = {"broken interpreter": "#!/nonexistent/python3\n", "crash": "#!/bin/sh\nexit 1\n"}


def unable_hook_bin(tmp_path: Path, hook: str) -> Path:
    """A directory for the front of PATH where harness-hook is missing, names an
    interpreter that is not there, or crashes (exit 1)."""
    directory = tmp_path / "unable-bin"
    directory.mkdir()
    if hook in HOOK_SCRIPTS:
        (directory / "harness-hook").write_text(HOOK_SCRIPTS[hook])
        (directory / "harness-hook").chmod(0o755)
    path = f"{directory}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    assert (shutil.which("harness-hook", path=path) is None) == (hook == "missing")
    return directory
