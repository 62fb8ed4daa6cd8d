"""Codex CLI's hooks: `POST /api/v1/hooks/codex` (docs/coding-agents.md).

Codex runs its command hooks with JSON on standard input, in Claude Code's shape
(`session_id`, `cwd`, `hook_event_name`, `tool_name`, `tool_input`, `tool_use_id`,
`turn_id`, `model`, `permission_mode`, ...). PreToolUse admits the call through the
whole pipeline. Codex 0.171.0 obeys a `permissionDecision` of "deny" (the reason reaches
the model) but treats "allow" as a failed hook, so an allow is answered with no decision
at all, only a `systemMessage` naming who allowed it: Codex then goes on with its own
approval policy, which Harness never loosens. PostToolUse reports the result; the
session's other events are recorded for its timeline.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse

from audit import kinds
from dispatcher.tools.codex import CLIENT

from .client_calls import Verdict
from .hooks import HookDialect, handle_hook, hook_doc, hook_router, text_result

router = hook_router()

RECORDED: dict[str, tuple[str, tuple[str, ...]]] = {
    "SessionStart": (kinds.CLIENT_SESSION_STARTED, ("source", "model")),
    "UserPromptSubmit": (kinds.CLIENT_PROMPT, ("prompt", "turn_id", "permission_mode")),
    "Stop": (kinds.CLIENT_STOPPED, ("stop_hook_active", "last_assistant_message")),
    "SessionEnd": (kinds.CLIENT_SESSION_ENDED, ("reason",)),
}


def pre_tool_use_output(verdict: Verdict) -> dict[str, Any]:
    """Codex's hook output: a deny decision with its reason, or, for an allow, only a
    message for the user (Codex's "allow" is not a decision it accepts)."""
    if not verdict.allowed:
        return {
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": verdict.reason,
            }
        }
    return {"systemMessage": f"Harness: {verdict.reason}"}


DIALECT = HookDialect(
    client=CLIENT,
    label="Codex",
    pre_event="PreToolUse",
    answer=pre_tool_use_output,
    reports={"PostToolUse": lambda body: (text_result(body.get("tool_response", "")), False)},
    recorded=RECORDED,
)


@router.post("/codex", summary="Codex CLI hook", openapi_extra=hook_doc("Codex"))
async def codex_hook(request: HttpRequest, wait: float | None = None) -> HttpResponse:
    """PreToolUse: deny in Codex's hook output format, or no objection (a systemMessage),
    waiting up to `wait` seconds while a reviewer decides. PostToolUse: the tool's result is
    recorded. Other events: recorded for the timeline or ignored (`{}`)."""
    return await handle_hook(request, DIALECT, wait)
