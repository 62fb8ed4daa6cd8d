"""Claude Code's hooks: `POST /api/v1/hooks/claude-code` (docs/claude-code.md).

Claude Code runs its hooks with their input as JSON (`session_id`, `cwd`,
`hook_event_name`, `tool_name`, `tool_input`, `tool_use_id`, ...; fields not named here
are ignored). PreToolUse admits the call through the whole pipeline and answers in Claude
Code's hook output format, allow or deny with the reason, holding the request while a
reviewer decides (up to `?wait=` seconds); it never answers with changed input.
PostToolUse and PostToolUseFailure report what the tool returned; the session's other
events are recorded for its timeline. What the coding agents' endpoints share is
dispatcher.gateways.hooks; the decision is
dispatcher.gateways.client_calls.decide_client_call.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse

from audit import kinds
from dispatcher.tools.claude_code import CLIENT

from .client_calls import Verdict
from .hooks import HookDialect, handle_hook, hook_doc, hook_router, text_result

router = hook_router()

# The session events recorded for the timeline, and the fields of each that are kept.
RECORDED: dict[str, tuple[str, tuple[str, ...]]] = {
    "SessionStart": (kinds.CLIENT_SESSION_STARTED, ("source", "model")),
    "UserPromptSubmit": (kinds.CLIENT_PROMPT, ("prompt", "prompt_id", "permission_mode")),
    "Stop": (kinds.CLIENT_STOPPED, ("stop_hook_active", "last_assistant_message")),
    "SessionEnd": (kinds.CLIENT_SESSION_ENDED, ("reason",)),
}
REPORTS = ("PostToolUse", "PostToolUseFailure")


def pre_tool_use_output(verdict: Verdict) -> dict[str, Any]:
    """Claude Code's hook output for a decision (never `updatedInput`)."""
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": verdict.action,
            "permissionDecisionReason": verdict.reason,
        }
    }


DIALECT = HookDialect(
    client=CLIENT,
    label="Claude Code",
    pre_event="PreToolUse",
    answer=pre_tool_use_output,
    reports={
        "PostToolUse": lambda body: (text_result(body.get("tool_response", "")), False),
        "PostToolUseFailure": lambda body: (text_result(body.get("error", "")), True),
    },
    recorded=RECORDED,
)


@router.post("/claude-code", summary="Claude Code hook", openapi_extra=hook_doc("Claude Code"))
async def claude_code_hook(request: HttpRequest, wait: float | None = None) -> HttpResponse:
    """PreToolUse: allow or deny in Claude Code's hook output format, waiting up to `wait`
    seconds while a reviewer decides. PostToolUse, PostToolUseFailure: the tool's result
    is recorded. Other events: recorded for the timeline or ignored. Answers 200 with `{}`
    when there is nothing to tell Claude Code."""
    return await handle_hook(request, DIALECT, wait)
