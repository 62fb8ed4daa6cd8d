"""What the hook endpoints of coding agents share (docs/claude-code.md, docs/coding-agents.md).

Claude Code, Codex CLI and Gemini CLI each run a command hook before a tool call, with a
JSON hook input (`session_id`, `cwd`, `hook_event_name`, `tool_name`, `tool_input`, and,
except Gemini CLI, `tool_use_id`; fields not named here are ignored). Each has its own
endpoint, tool set and answer format, described by a `HookDialect`; the rest is here:
one client session is one Harness session (keyed by its session_id, titled and confined
by its cwd); the pre-tool event admits the call through the whole pipeline
(dispatcher.gateways.client_calls.decide_client_call) and answers allow or deny in the
client's own format, holding the request while a reviewer decides (up to `?wait=`
seconds), never with changed input; the post-tool event reports what the tool returned;
the session's other events are recorded for its timeline.

A gateway translates the protocol only: no policy, no state change of its own.
"""

from __future__ import annotations

import json
import logging
import posixpath
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db.models import Case, When
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Router

from agentauth import tokens
from audit import kinds
from dispatcher import agents, limits, transitions
from dispatcher.gateways.dialects import (
    MAX_ID_LENGTH,
    UnstorableJSON,
    check_storable,
    storable_copy,
)
from dispatcher.models import Agent, AgentSession, Status, ToolCall
from dispatcher.proposals import ProposedCall, canonical_json, digest_of
from floor.compiled import Compiled

from .api import (
    BodyError,
    SubmitToken,
    error,
    read_json,
    refused,
    too_many_requests,
    too_many_sessions,
)
from .client_calls import Verdict, admit_client_call, verdict_after

logger = logging.getLogger(__name__)

MAX_PATH_LENGTH = 1000
TEXT_LIMIT = 10_000  # characters of a prompt or a last message kept for the timeline


class HookError(ValueError):
    """The hook input cannot be used; the message says which field and what it needs."""


class HookToken(SubmitToken):
    """A hook's auth: an agent's bearer token, or an OAuth access token (`harness-hook
    login`), by its form only; the hook verifies it in its session's read."""

    async def authenticate(self, request: HttpRequest, token: str) -> str | None:
        return (
            token if tokens.is_access_token(token) else await super().authenticate(request, token)
        )


def hook_router() -> Router:
    """A hook endpoint's router. Its auth checks only the token's form: the hook verifies
    the token in the same read as its session (agents.client_session_for_token), so a
    pre-tool hook makes one hop to the ORM's thread; a bad token still answers 401, with
    nothing recorded."""
    return Router(tags=["hooks"], auth=HookToken())


def text_result(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class HookDialect:
    """One coding agent's hook protocol.

    `reports` maps each post-tool event to a function of its hook input giving the
    result's (content, is_error). `recorded` maps session events to the audit kind and the
    input fields kept. `ids` is False for a client that sends no `tool_use_id` (Gemini
    CLI): Harness then names each call itself, and a report finds its call by tool name
    and input digest.
    """

    client: str  # the tool set's client, and the session's `client`
    label: str  # the client's name in messages ("Claude Code")
    pre_event: str
    answer: Callable[[Verdict], dict[str, Any]]
    reports: dict[str, Callable[[dict[str, Any]], tuple[str, bool]]]
    recorded: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    ids: bool = True


@dataclass(frozen=True)
class Hook:
    event: str
    session_id: str
    cwd: str
    body: dict[str, Any]
    label: str = "the client"

    def tool_call(self, ids: bool = True) -> tuple[str, dict[str, Any], str]:
        """(tool_name, tool_input, tool_use_id) of a tool event, checked; the id is ""
        for a client that sends none (`ids` False)."""
        name = _text(self.body, "tool_name", MAX_ID_LENGTH, self.label)
        tool_input = self.body.get("tool_input")
        if not isinstance(tool_input, dict):
            raise HookError("'tool_input' must be a JSON object (the tool's input).")
        if not ids:
            return name, tool_input, ""
        return name, tool_input, _text(self.body, "tool_use_id", MAX_ID_LENGTH, self.label)


def _text(body: dict[str, Any], name: str, limit: int, label: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise HookError(f"'{name}' must be a non-empty string, as {label} sends it.")
    if len(value) > limit:
        raise HookError(f"'{name}' is longer than {limit} characters.")
    return value


def parse_hook(body: Any, label: str = "Claude Code") -> Hook:
    """The hook input the client sent; raises HookError naming what is missing or wrong."""
    if not isinstance(body, dict):
        raise HookError(f"Send the hook input as {label} does: one JSON object.")
    event = _text(body, "hook_event_name", 64, label)
    session_id = _text(body, "session_id", MAX_ID_LENGTH, label)
    cwd = _text(body, "cwd", MAX_PATH_LENGTH, label)
    if not cwd.startswith("/"):
        raise HookError(f"'cwd' must be an absolute path: the directory {label} runs in.")
    return Hook(event, session_id, posixpath.normpath(cwd), body, label)


def hook_wait(wait: float | None) -> float:
    """How long a pre-tool hook may hold the request: `?wait=`, else the default, at most
    the max."""
    seconds = settings.HARNESS_HOOK_DEFAULT_WAIT if wait is None else wait
    return max(0.0, min(float(seconds), settings.HARNESS_HOOK_MAX_WAIT))


def _session(token: str, hook: Hook, dialect: HookDialect, audience: str) -> AgentSession | None:
    """The hook's session, with its agent, owner and profile (one read once it exists);
    None when the token is not an active agent's. `token` is an agent's bearer token or
    an OAuth access token issued for `audience`, this Harness's hooks API (`harness-hook
    login`: agentauth.tokens). The agent's request rate is taken before a session is
    started or anything admitted (raises limits.TooManyRequests)."""
    if tokens.is_access_token(token):
        found = tokens.loaded_session(token, dialect.client, hook.session_id, audience)
        if found is not None:
            limits.take_request(found.agent, token)
            return found  # type: ignore[no-any-return]
        agent = tokens.agent_for(token, audience)
        if agent is None:
            return None
        limits.take_request(agent, token)
        return agents.client_session(
            agent=agent,
            client=dialect.client,
            external_id=hook.session_id,
            project_dir=hook.cwd,
            mode=getattr(agent, "mode_ceiling", None),
        )
    session = agents.loaded_client_session(token, dialect.client, hook.session_id)
    if session is not None:
        limits.take_request(session.agent, token)
        return session
    agent = agents.authenticate_token(token)
    if agent is None:
        return None
    limits.take_request(agent, token)
    return agents.client_session(
        agent=agent, client=dialect.client, external_id=hook.session_id, project_dir=hook.cwd
    )


def _admit(
    token: str,
    hook: Hook,
    tool: tuple[str, dict[str, Any], str],
    dialect: HookDialect,
    audience: str,
) -> tuple[AgentSession, ToolCall | Verdict] | None:
    """A pre-tool hook's session and its admitted call, in one hop to the ORM's thread:
    the token checked in the session's read, the profile read with it. None: a bad token."""
    session = _session(token, hook, dialect, audience)
    if session is None:
        return None
    name, tool_input, tool_use_id = tool
    admitted = admit_client_call(
        session=session,
        tool_name=name,
        tool_input=tool_input,
        tool_use_id=tool_use_id or f"{dialect.client}-{uuid.uuid4().hex}",
        profile_preloaded=True,
        client_cwd=hook.cwd,
    )
    return session, admitted


# The call a report is about, by the id the client gave it (floor.compiled).
_BY_TOOL_USE_ID = Compiled(
    lambda session_id, tool_use_id: ToolCall.objects.filter(
        session_id=session_id, tool_use_id=tool_use_id
    ).order_by()[:1]
)


def _reported_call(
    session: AgentSession, tool: tuple[str, dict[str, Any], str], dialect: HookDialect
) -> ToolCall | None:
    """The call a report is about: in the hook's session, else (one more read, on this
    miss only) in another session of the agent for the same client session id, started
    for a team the agent has left ("Moving an agent", docs/teams.md): a call released
    before the move is reported after it in its own session, never in the new team's."""
    name, tool_input, tool_use_id = tool
    if dialect.ids:
        call = _BY_TOOL_USE_ID.first(session.pk, tool_use_id)
        return call if call is not None else _former_call(session, tool, dialect)
    calls = ToolCall.objects.filter(session=session)
    # No ids: the oldest released call of this tool with exactly this input.
    digest = digest_of(ProposedCall("", name, canonical_json(tool_input), tool_input))
    released = calls.filter(name=name, digest=digest, status=Status.RELEASED)
    call = released.order_by("created_at").first()
    return call if call is not None else _former_call(session, tool, dialect)


def _former_call(
    session: AgentSession, tool: tuple[str, dict[str, Any], str], dialect: HookDialect
) -> ToolCall | None:
    """The call of another of the agent's sessions with this client and client session id
    (any team) that a report is about, with its session (whose agent is `session`'s): by
    its id, a released one first; without ids, the oldest released one of this tool and
    exact input."""
    name, tool_input, tool_use_id = tool
    calls = ToolCall.objects.select_related("session").filter(
        session__agent_id=session.agent_id,
        session__client=session.client,
        session__external_id=session.external_id,
    )
    calls = calls.exclude(session_id=session.pk)
    if dialect.ids:
        released_first = Case(When(status=Status.RELEASED, then=0), default=1)
        call = calls.filter(tool_use_id=tool_use_id).order_by(released_first, "-created_at")
    else:
        digest = digest_of(ProposedCall("", name, canonical_json(tool_input), tool_input))
        call = calls.filter(name=name, digest=digest, status=Status.RELEASED)
        call = call.order_by("created_at")
    found = call.first()
    if found is not None:
        found.session.agent = session.agent
    return found


def _session_and_report(
    token: str,
    hook: Hook,
    tool: tuple[str, dict[str, Any], str],
    dialect: HookDialect,
    audience: str,
) -> AgentSession | None:
    """A report's session (None: a bad token) and the report, in one hop to the ORM's thread."""
    session = _session(token, hook, dialect, audience)
    if session is not None:
        _report(session.agent, session, hook, tool, dialect)
    return session


def _report(
    agent: Agent,
    session: AgentSession,
    hook: Hook,
    tool: tuple[str, dict[str, Any], str],
    dialect: HookDialect,
) -> None:
    """The tool ran on the client: its result becomes the call's, marked as reported, with
    whether the input the client reports is the one it was allowed (and, when not, the
    input it reports). The call may be of a session of the agent's former team
    (`_reported_call`): the report is filed there, in the call's own session. A report that
    finds no released call is recorded as an orphan (client.report_orphaned), in the
    session of the call it names when there is one, else in the hook's session: it is
    never dropped without a trace, and never copied into another team's session."""
    name, tool_input, tool_use_id = tool
    call = _reported_call(session, tool, dialect)
    content, is_error = dialect.reports[hook.event](hook.body)
    reported = ProposedCall(tool_use_id, name, canonical_json(tool_input), tool_input)
    if call is None:
        _record_orphan(session, hook, reported, content, is_error, None)
        return
    matches = name == call.name and digest_of(reported) == call.digest
    extra: dict[str, Any] = {"input_matches": matches}
    if not matches:  # what the client says it ran, for the auditor to compare
        extra |= {"reported_tool": name, "reported_input": reported.raw_arguments}
    filed = transitions.report_result(
        call_id=call.pk,
        content=content,
        is_error=is_error,
        actor=f"agent:{agent.name}",
        source=f"{dialect.client}:{hook.event}",
        extra=extra,
    )
    if not filed:  # reported already, past its lease, or never allowed
        own = session if call.session_id == session.pk else call.session
        _record_orphan(own, hook, reported, content, is_error, call)


def _record_orphan(
    session: AgentSession,
    hook: Hook,
    reported: ProposedCall,
    content: str,
    is_error: bool,
    call: ToolCall | None,
) -> None:
    """A report no released call takes, in the session's chain; on the call's card when it
    names a call that was not released (`call`), else on the session's page."""
    if call is not None:
        why = f"the call it names was {call.status}, not released"
    elif hook.body.get("tool_use_id"):
        why = "no call of this session has this id"
    else:
        why = "no released call of this session has this tool and exact input"
    payload: dict[str, Any] = {
        "event": hook.event,
        "tool_name": reported.name,
        "tool_use_id": reported.tool_use_id,
        "tool_input": reported.raw_arguments,
        "input_digest": digest_of(reported),
        "content": content[:TEXT_LIMIT],
        "is_error": is_error,
        "reason": why,
    }
    if call is not None:
        payload["call_id"] = str(call.pk)
    agents.record_client_event(
        session=session,
        kind=kinds.CLIENT_REPORT_ORPHANED,
        payload=payload,
        subject=f"call:{call.pk}" if call is not None else "",
    )
    logger.warning("%s reported %s %s: %s", hook.label, reported.name, reported.tool_use_id, why)


def _record(session: AgentSession, hook: Hook, dialect: HookDialect) -> None:
    kind, fields = dialect.recorded[hook.event]
    payload: dict[str, Any] = {"event": hook.event, "cwd": hook.cwd}
    for name in fields:
        value = hook.body.get(name)
        if isinstance(value, str):
            payload[name] = value[:TEXT_LIMIT]
        elif isinstance(value, bool | int | float):
            payload[name] = value
    agents.record_client_event(session=session, kind=kind, payload=payload)


def hook_doc(label: str) -> dict[str, Any]:
    """The OpenAPI request body of a hook endpoint."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "description": f"{label}'s hook input, as it sends it (session_id, "
                        "cwd, hook_event_name, tool_name, tool_input, ...).",
                        "type": "object",
                    }
                }
            },
        }
    }


async def handle_hook(
    request: HttpRequest, dialect: HookDialect, wait: float | None
) -> HttpResponse:
    """One hook request of `dialect`'s client: the pre-tool event's decision in the client's
    format; a report or a session event recorded (answered `{}`); other events ignored.
    A hook that would start the agent's session past HARNESS_MAX_SESSIONS_PER_MINUTE is
    answered 429, nothing recorded (harness-hook then blocks the tool, saying why)."""
    try:
        return await _handle_hook(request, dialect, wait)
    except limits.TooManySessions as refusal:
        return too_many_sessions(refusal)
    except limits.TooManyRequests as refusal:
        return too_many_requests(refusal)


def read_hook_input(request: HttpRequest, dialect: HookDialect) -> Any:
    """The hook input. The pre-tool event's must be stored exactly as sent (its input is
    what is decided; UnstorableJSON says what to change); any other event's text is made
    storable instead (dialects.storable_copy): a tool's output or a prompt with a NUL
    character is the client's to report, not to change, and refusing it would lose the
    report (the agent could then hide what a tool returned). Raises BodyError."""
    body = read_json(request, checked=False)
    if isinstance(body, dict) and body.get("hook_event_name") == dialect.pre_event:
        check_storable(body)
        return body
    try:
        return storable_copy(body)
    except RecursionError:
        message = "The body is nested too deeply to read; send a flatter message."
        raise BodyError(error(400, "malformed_json", message)) from None


async def _handle_hook(
    request: HttpRequest, dialect: HookDialect, wait: float | None
) -> HttpResponse:
    token = str(request.auth)  # type: ignore[attr-defined]
    audience = request.build_absolute_uri(tokens.HOOKS_PATH)  # an OAuth token's
    tool_events = (dialect.pre_event, *dialect.reports)
    try:
        hook = parse_hook(read_hook_input(request, dialect), dialect.label)
        tool = hook.tool_call(dialect.ids) if hook.event in tool_events else None
    except BodyError as exc:
        return exc.response
    except HookError as exc:
        return error(422, "invalid_hook_input", str(exc))
    except UnstorableJSON as exc:
        return error(422, "unstorable_json", str(exc))
    if tool is not None and hook.event == dialect.pre_event:
        admitted = await sync_to_async(_admit)(token, hook, tool, dialect, audience)
        if admitted is None:
            return await sync_to_async(refused)(token)
        session, call = admitted
        verdict = await verdict_after(call, session, hook_wait(wait))
        return JsonResponse(dialect.answer(verdict))
    if tool is not None:
        if await sync_to_async(_session_and_report)(token, hook, tool, dialect, audience) is None:
            return await sync_to_async(refused)(token)
        return JsonResponse({})
    found = await sync_to_async(_session)(token, hook, dialect, audience)
    if found is None:
        return await sync_to_async(refused)(token)
    if hook.event in dialect.recorded:
        await sync_to_async(_record)(found, hook, dialect)
    return JsonResponse({})
