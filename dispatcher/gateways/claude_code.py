"""Claude Code's hooks: `POST /api/v1/hooks/claude-code` (docs/claude-code.md).

Claude Code runs its hooks with their input as JSON (`session_id`, `cwd`,
`hook_event_name`, `tool_name`, `tool_input`, `tool_use_id`, ...; fields not named here
are ignored). One Claude Code session is one Harness session (keyed by its session_id,
titled and confined by its cwd). PreToolUse admits the call through the whole pipeline
and answers in Claude Code's hook output format, allow or deny with the reason, holding
the request while a reviewer decides (up to `?wait=` seconds); it never answers with
changed input. PostToolUse and PostToolUseFailure report what the tool returned; the
session's other events are recorded for its timeline. The agent's bearer token
authenticates, as on the rest of the agent API.

This module translates the protocol only; the decision is
dispatcher.gateways.client_calls.decide_client_call, shared with other such clients.
"""

from __future__ import annotations

import json
import logging
import posixpath
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router

from audit import kinds
from dispatcher import agents, transitions
from dispatcher.gateways.dialects import MAX_ID_LENGTH
from dispatcher.models import Agent, AgentSession, ToolCall
from dispatcher.proposals import ProposedCall, canonical_json, digest_of
from dispatcher.tools.claude_code import CLIENT

from .api import BodyError, agent_of, error, read_json
from .client_calls import Verdict, decide_client_call

logger = logging.getLogger(__name__)

router = Router(tags=["hooks"])

MAX_PATH_LENGTH = 1000
TEXT_LIMIT = 10_000  # characters of a prompt or a last message kept for the timeline
# The session events recorded for the timeline, and the fields of each that are kept.
RECORDED: dict[str, tuple[str, tuple[str, ...]]] = {
    "SessionStart": (kinds.CLIENT_SESSION_STARTED, ("source", "model")),
    "UserPromptSubmit": (kinds.CLIENT_PROMPT, ("prompt", "prompt_id", "permission_mode")),
    "Stop": (kinds.CLIENT_STOPPED, ("stop_hook_active", "last_assistant_message")),
    "SessionEnd": (kinds.CLIENT_SESSION_ENDED, ("reason",)),
}
REPORTS = ("PostToolUse", "PostToolUseFailure")


class HookError(ValueError):
    """The hook input cannot be used; the message says which field and what it needs."""


@dataclass(frozen=True)
class Hook:
    event: str
    session_id: str
    cwd: str
    body: dict[str, Any]

    def tool_call(self) -> tuple[str, dict[str, Any], str]:
        """(tool_name, tool_input, tool_use_id) of a tool event, checked."""
        name = _text(self.body, "tool_name", MAX_ID_LENGTH)
        tool_input = self.body.get("tool_input")
        if not isinstance(tool_input, dict):
            raise HookError("'tool_input' must be a JSON object (the tool's input).")
        return name, tool_input, _text(self.body, "tool_use_id", MAX_ID_LENGTH)


def _text(body: dict[str, Any], name: str, limit: int) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise HookError(f"'{name}' must be a non-empty string, as Claude Code sends it.")
    if len(value) > limit:
        raise HookError(f"'{name}' is longer than {limit} characters.")
    return value


def parse_hook(body: Any) -> Hook:
    """The hook input Claude Code sent; raises HookError naming what is missing or wrong."""
    if not isinstance(body, dict):
        raise HookError("Send the hook input as Claude Code does: one JSON object.")
    event = _text(body, "hook_event_name", 64)
    session_id = _text(body, "session_id", MAX_ID_LENGTH)
    cwd = _text(body, "cwd", MAX_PATH_LENGTH)
    if not cwd.startswith("/"):
        raise HookError("'cwd' must be an absolute path: the directory Claude Code runs in.")
    return Hook(event, session_id, posixpath.normpath(cwd), body)


def hook_wait(wait: float | None) -> float:
    """How long PreToolUse may hold the request: `?wait=`, else the default, at most the max."""
    seconds = settings.HARNESS_HOOK_DEFAULT_WAIT if wait is None else wait
    return max(0.0, min(float(seconds), settings.HARNESS_HOOK_MAX_WAIT))


def pre_tool_use_output(verdict: Verdict) -> dict[str, Any]:
    """Claude Code's hook output for a decision (never `updatedInput`)."""
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": verdict.action,
            "permissionDecisionReason": verdict.reason,
        }
    }


def _session(agent: Agent, hook: Hook) -> AgentSession:
    return agents.client_session(
        agent=agent, client=CLIENT, external_id=hook.session_id, project_dir=hook.cwd
    )


def _result_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _report(
    agent: Agent, session: AgentSession, hook: Hook, tool: tuple[str, dict[str, Any], str]
) -> None:
    """The tool ran on the client: its result becomes the call's, marked as reported."""
    name, tool_input, tool_use_id = tool
    call = ToolCall.objects.filter(session=session, tool_use_id=tool_use_id).first()
    if call is None:
        logger.warning("Claude Code reported %s %s, which Harness never decided", name, tool_use_id)
        return
    failed = hook.event == "PostToolUseFailure"
    content = _result_text(hook.body.get("error" if failed else "tool_response", ""))
    reported = ProposedCall(tool_use_id, name, canonical_json(tool_input), tool_input)
    transitions.report_result(
        call_id=call.pk,
        content=content,
        is_error=failed,
        actor=f"agent:{agent.name}",
        source=f"{CLIENT}:{hook.event}",
        # The input the client says it ran is the input it was allowed (the same digest).
        extra={"input_matches": name == call.name and digest_of(reported) == call.digest},
    )


def _record(session: AgentSession, hook: Hook) -> None:
    kind, fields = RECORDED[hook.event]
    payload: dict[str, Any] = {"event": hook.event, "cwd": hook.cwd}
    for name in fields:
        value = hook.body.get(name)
        if isinstance(value, str):
            payload[name] = value[:TEXT_LIMIT]
        elif isinstance(value, bool | int | float):
            payload[name] = value
    agents.record_client_event(session=session, kind=kind, payload=payload)


HOOK_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "description": "Claude Code's hook input, as it sends it (session_id, cwd, "
                    "hook_event_name, tool_name, tool_input, tool_use_id, ...).",
                    "type": "object",
                }
            }
        },
    }
}


@router.post("/claude-code", summary="Claude Code hook", openapi_extra=HOOK_DOC)
async def claude_code_hook(request: HttpRequest, wait: float | None = None) -> HttpResponse:
    """PreToolUse: allow or deny in Claude Code's hook output format, waiting up to `wait`
    seconds while a reviewer decides. PostToolUse, PostToolUseFailure: the tool's result
    is recorded. Other events: recorded for the timeline or ignored. Answers 200 with `{}`
    when there is nothing to tell Claude Code."""
    agent = agent_of(request)
    try:
        hook = parse_hook(read_json(request))
        tool = hook.tool_call() if hook.event in ("PreToolUse", *REPORTS) else None
    except BodyError as exc:
        return exc.response
    except HookError as exc:
        return error(422, "invalid_hook_input", str(exc))
    session = await sync_to_async(_session)(agent, hook)
    if tool is not None and hook.event == "PreToolUse":
        name, tool_input, tool_use_id = tool
        verdict = await decide_client_call(
            session=session,
            tool_name=name,
            tool_input=tool_input,
            tool_use_id=tool_use_id,
            wait_seconds=hook_wait(wait),
        )
        return JsonResponse(pre_tool_use_output(verdict))
    if tool is not None:
        await sync_to_async(_report)(agent, session, hook, tool)
    elif hook.event in RECORDED:
        await sync_to_async(_record)(session, hook)
    return JsonResponse({})
