"""Gemini CLI's hooks: `POST /api/v1/hooks/gemini` (docs/coding-agents.md).

Gemini CLI runs its command hooks with JSON on standard input (`session_id`, `cwd`,
`hook_event_name`, `timestamp`, `transcript_path`; for tools `tool_name`, `tool_input`,
and `mcp_context` for MCP tools). It sends no tool call id, so Harness names each call
itself and an AfterTool report finds its call by tool name and exact input. BeforeTool
admits the call through the whole pipeline and answers `{"decision": "allow"|"deny",
"reason": ...}` (the reason of a deny reaches the model as the tool's error); it never
answers with `hookSpecificOutput.tool_input` (changed input). AfterTool reports the
result; the session's other events are recorded for its timeline.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse

from audit import kinds
from dispatcher.tools.gemini import CLIENT

from .client_calls import Verdict
from .hooks import HookDialect, handle_hook, hook_doc, hook_router, text_result

router = hook_router()

RECORDED: dict[str, tuple[str, tuple[str, ...]]] = {
    "SessionStart": (kinds.CLIENT_SESSION_STARTED, ("source",)),
    "BeforeAgent": (kinds.CLIENT_PROMPT, ("prompt",)),
    "AfterAgent": (kinds.CLIENT_STOPPED, ("stop_hook_active", "prompt_response")),
    "SessionEnd": (kinds.CLIENT_SESSION_ENDED, ("reason",)),
}


def before_tool_output(verdict: Verdict) -> dict[str, Any]:
    """Gemini CLI's hook output for a decision (never a changed tool_input)."""
    return {"decision": verdict.action, "reason": verdict.reason}


def after_tool_result(body: dict[str, Any]) -> tuple[str, bool]:
    """AfterTool's tool_response ({llmContent, returnDisplay, error}): what the model read,
    and whether the tool failed."""
    response = body.get("tool_response")
    if not isinstance(response, dict):
        return text_result(response if response is not None else ""), False
    content = response.get("llmContent")
    failed = bool(response.get("error"))
    if isinstance(content, str):
        return content, failed
    return text_result(response), failed


DIALECT = HookDialect(
    client=CLIENT,
    label="Gemini CLI",
    pre_event="BeforeTool",
    answer=before_tool_output,
    reports={"AfterTool": after_tool_result},
    recorded=RECORDED,
    ids=False,
)


@router.post("/gemini", summary="Gemini CLI hook", openapi_extra=hook_doc("Gemini CLI"))
async def gemini_hook(request: HttpRequest, wait: float | None = None) -> HttpResponse:
    """BeforeTool: allow or deny in Gemini CLI's hook output format, waiting up to `wait`
    seconds while a reviewer decides. AfterTool: the tool's result is recorded. Other
    events: recorded for the timeline or ignored (`{}`)."""
    return await handle_hook(request, DIALECT, wait)
