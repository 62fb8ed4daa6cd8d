"""The agent API (docs/api.md): async views, bearer tokens, three dialects.

Each request makes at most two hops to the ORM thread (authenticate, then one service
call); a request that waits sleeps on the process's shared Redis subscription to its
session's channel (dispatcher.wakeups) and re-reads the calls only when a change can have
finished one of them: no polling. At most HARNESS_MAX_WAITS_PER_AGENT requests of one
agent wait at once, counted with its hook and MCP waits in every process
(dispatcher.limits; 429 beyond).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, DataError, connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import NinjaAPI, Schema
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer

from dispatcher import admission, agents, limits, transitions, wakeups
from dispatcher.answers import answer_content, answer_of, follow_edits, is_done
from dispatcher.gateways.dialects import (
    DialectError,
    UnstorableJSON,
    format_results,
    loads,
    parse_submission,
)
from dispatcher.models import TERMINAL_STATUSES, Agent, AgentSession, Status, ToolCall
from dispatcher.policy.models import Mode
from dispatcher.tools.base import model_facing_schema
from dispatcher.tools.registry import all_tools
from dispatcher.wakeups import session_channel
from floor import errors
from floor.compiled import Compiled

logger = logging.getLogger(__name__)


class AgentToken(HttpBearer):
    async def authenticate(self, request: HttpRequest, token: str) -> Agent | None:
        if (refusal := limits.refused_early(token, getattr(request, "scope", None))) is not None:
            raise refusal
        return await sync_to_async(_counted_agent)(token)


def _counted_agent(token: str) -> Agent | None:
    """The token's agent, once it has taken a request from its rate (raises
    limits.TooManyRequests, answered 429 by `_too_many_requests`). Raises VoidedToken for
    a token a holder's leaving voided (answered 401, saying so)."""
    agent = agents.authenticate_token(token)
    if agent is not None:
        limits.take_request(agent, token)
    elif reason := agents.voided_refusal(token):
        raise VoidedToken(reason)
    return agent


class VoidedToken(AuthenticationError):
    """A token voided because a person who was shown it left: 401 with the reason."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


class SubmitToken(HttpBearer):
    """The submit endpoint's auth: only the token's form here; the view verifies the token
    in the same read as the session (agents.session_for_token), so the hot path makes
    one hop to the ORM thread and one query for both. A bad token still answers 401."""

    async def authenticate(self, request: HttpRequest, token: str) -> str | None:
        if (refusal := limits.refused_early(token, getattr(request, "scope", None))) is not None:
            raise refusal
        return token if agents.token_prefix(token) else None


api = NinjaAPI(
    title="Harness agent API",
    version="1",
    urls_namespace="agent-api",
    auth=AgentToken(),
    openapi_url="/openapi.json",
    docs_url=None,
)


def error(status: int, code: str, message: str, **extra: Any) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message, **extra}}, status=status)


@api.exception_handler(AuthenticationError)
def _unauthorized(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return unauthorized(getattr(exc, "reason", ""))


def unauthorized(reason: str = "") -> JsonResponse:
    """401 invalid_token; `reason` says why when Harness knows more than "not valid" (a
    token voided by a holder's leaving: agents.voided_refusal)."""
    return error(
        401,
        "invalid_token",
        reason
        or "Missing, malformed, revoked or unknown agent token. Send 'Authorization: Bearer "
        "<token>' with a token from `manage.py create_agent`.",
    )


def refused(token: str) -> JsonResponse:
    """The 401 for a `token` that authenticated nothing: it reads whether the token was
    voided (one read, on the refusal's path only)."""
    return unauthorized(agents.voided_refusal(token))


@api.exception_handler(limits.TooManyRequests)
def _too_many_requests(request: HttpRequest, exc: limits.TooManyRequests) -> HttpResponse:
    return too_many_requests(exc)


def too_many_requests(refusal: limits.TooManyRequests) -> JsonResponse:
    """429: the agent is past its request rate; nothing of the request was read."""
    response = error(429, "too_many_requests", str(refusal), retry_after_ms=refusal.retry_after_ms)
    response["Retry-After"] = str(refusal.retry_after)
    return response


@api.exception_handler(ValidationError)
def _invalid(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    details = [{"loc": e.get("loc"), "message": e.get("msg")} for e in exc.errors]
    return error(422, "invalid_request", "The request is not valid; see details.", details=details)


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    return error(exc.status_code, "bad_request", str(exc))


@api.exception_handler(DataError)
def _unstorable(request: HttpRequest, exc: DataError) -> HttpResponse:
    logger.warning("agent API data error: %s", exc)
    return error(
        422,
        "unstorable_value",
        "A value in this request cannot be stored (too long or malformed for its field); "
        "nothing was recorded. Shorten or correct it and send the message again.",
    )


@api.exception_handler(DatabaseError)
def _storage(request: HttpRequest, exc: DatabaseError) -> HttpResponse:
    # Fail closed: the change and its audit event commit together or not at all.
    logger.exception("agent API storage error")
    return error(
        503,
        "storage_unavailable",
        "Harness could not record this request (its database refused the write), so nothing "
        "was decided or run. Retry the same message later; call ids make the retry safe.",
    )


@api.exception_handler(Exception)
def _internal(request: HttpRequest, exc: Exception) -> HttpResponse:
    logger.exception("agent API error")
    return error(
        500,
        "internal_error",
        "Harness hit an internal error; nothing was decided. Retry the request.",
    )


# --- Bodies ------------------------------------------------------------------------------


class BodyError(Exception):
    def __init__(self, response: JsonResponse) -> None:
        self.response = response


def read_json(request: HttpRequest, *, checked: bool = True) -> Any:
    """The JSON body, or BodyError with 413 (too large), 400 (not JSON) or 422 (text or a
    number no database keeps; not checked when `checked` is False: dialects.loads)."""
    limit = settings.HARNESS_MAX_BODY_BYTES
    too_big = error(
        413,
        "body_too_large",
        f"The body is larger than {limit} bytes; send fewer or smaller calls.",
    )
    try:
        if int(request.META.get("CONTENT_LENGTH") or 0) > limit:
            raise BodyError(too_big)
        raw = request.body
    except (RequestDataTooBig, ValueError):
        raise BodyError(too_big) from None
    if len(raw) > limit:
        raise BodyError(too_big)
    if not raw.strip():
        return {}
    try:
        return loads(raw, checked=checked)
    except RecursionError:
        message = "The body is nested too deeply to read; send a flatter message."
        raise BodyError(error(400, "malformed_json", message)) from None
    except UnstorableJSON as exc:
        raise BodyError(error(422, "unstorable_json", str(exc))) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise BodyError(
            error(400, "malformed_json", f"The body is not valid JSON: {exc}.")
        ) from None


def clamp_wait(wait: float) -> float:
    return max(0.0, min(float(wait), settings.HARNESS_MAX_WAIT))


def reserve_wait(agent: Agent, seconds: float) -> str | limits.TooManyWaits:
    """Take one of the agent's wait slots (dispatcher.limits): the slot, or the refusal
    when the agent, or its person's agents together, hold all of theirs."""
    try:
        return limits.reserve_wait(agent, seconds)
    except limits.TooManyWaits as full:
        return full


def too_many_waits(full: limits.TooManyWaits) -> JsonResponse:
    """429: nothing of the request was recorded, so sending it again later creates it once."""
    response = error(
        429,
        "too_many_waits",
        full.message(
            "Nothing in this request was recorded or waited for. Wait until one of them "
            "answers, or send this request with wait=0 and ask for the results later with "
            "GET /api/v1/calls/{id}?wait=N."
        ),
    )
    response["Retry-After"] = str(limits.retry_after_wait())
    return response


def too_many_sessions(refusal: limits.TooManySessions) -> JsonResponse:
    response = error(429, "too_many_sessions", str(refusal))
    response["Retry-After"] = str(refusal.retry_after)
    return response


# --- Views of calls -----------------------------------------------------------------------


def call_url(call: ToolCall) -> str:
    return f"/api/v1/calls/{call.pk}"


def call_json(call: ToolCall) -> dict[str, Any]:
    answer = answer_of(call)
    terminal = answer.status in TERMINAL_STATUSES
    data: dict[str, Any] = {
        "id": str(call.pk),
        "tool_use_id": call.tool_use_id,
        "name": call.name,
        "status": answer.status,
        "decision": answer.decision or None,
        "decided_by": answer.decided_by or None,
        "reason": answer.reason or None,
        "is_error": answer.is_error if terminal else None,
        "content": answer_content(call) if terminal else None,
        "digest": call.digest,
        "url": call_url(call),
        "edited_from": str(call.edited_from_id) if call.edited_from_id else None,
    }
    if answer is not call:
        data["edited"] = {
            "by": call.decided_by.removeprefix("user:"),
            "call_id": str(answer.pk),
            "tool_use_id": answer.tool_use_id,
            "arguments": answer.arguments,
            "digest": answer.digest,
            "url": call_url(answer),
        }
    return data


def batch_json(calls: list[ToolCall], dialect: str) -> tuple[int, dict[str, Any]]:
    done = [(c.tool_use_id, answer_content(c), answer_of(c).is_error) for c in calls if is_done(c)]
    status = 200 if len(done) == len(calls) else 202
    return status, {
        "calls": [call_json(c) for c in calls],
        "results": format_results(dialect, done),
    }


def is_terminal(call: ToolCall) -> bool:
    return call.status in TERMINAL_STATUSES


# The statuses a call's wake-up may say without any watched call being done by it.
_UNFINISHED = frozenset(str(s) for s in Status if s not in TERMINAL_STATUSES)


async def wait_until_terminal(
    call_ids: list[str],
    seconds: float,
    reload: Callable[[], Awaitable[list[ToolCall]]],
    calls: list[ToolCall],
    settled: Callable[[ToolCall], bool] = is_done,
    joined: wakeups.Joined | None = None,
) -> list[ToolCall]:
    """Sleep until every call is done (or `settled`) or `seconds` pass; wake only on a
    change push. A reviewer's edit: the replacement's changes answer the call from then on.

    Wakes come from the sessions' channels, which announce every call of the session; a
    wake-up that says only other calls changed, or (waiting for done calls) that watched
    calls moved to unfinished states (queued, running), reads nothing: none of them can
    be done by it, and the change that finishes one sends its own wake-up (or the last
    read at the deadline sees it, if that one is lost).

    `joined`: a wait already registered on the calls' session channel before they were
    written (`wakeups.join_subscribed`): nothing published since can have been missed, so
    `calls` are as fresh as a read would make them and the first read is skipped. The
    caller leaves it.
    """
    if seconds <= 0 or all(settled(c) for c in calls):
        return calls
    quiet = _UNFINISHED if settled is is_done else frozenset()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    watched = set(call_ids)
    # (A reviewer's edit admits the replacement in its call's session: same channels.)
    channels = {session_channel(str(c.session_id)) for c in calls}
    try:
        if joined is not None and channels == {joined.channel} and joined.usable:
            watch: contextlib.AbstractAsyncContextManager[wakeups.Wakeup] = contextlib.nullcontext(
                joined.wakeup
            )
        else:
            watch, joined = wakeups.wake_on(channels), None
        async with watch as wakeup:
            if joined is None:
                calls = await reload()  # re-read after subscribing: nothing in between is lost
            calls = await _follow(wakeup, calls, watched, settled, quiet, deadline, reload)
        if all(settled(c) for c in calls):
            return calls  # read after the last wake-up: nothing newer to read
    except wakeups.WakeUnavailable:
        # The calls are stored and decided; only the wake-up channel failed. Answer with
        # their state now (202 if unfinished); the agent waits again by resubmitting.
        logger.warning("wake-up channel unavailable; answering without waiting", exc_info=True)
    # A last read when the time ran out: a wake-up lost in transit delays an answer, it
    # never makes it stale.
    return await reload()


async def _follow(
    wakeup: wakeups.Wakeup,
    calls: list[ToolCall],
    watched: set[str],
    settled: Callable[[ToolCall], bool],
    quiet: frozenset[str],
    deadline: float,
    reload: Callable[[], Awaitable[list[ToolCall]]],
) -> list[ToolCall]:
    """The calls re-read on every wake-up that can have changed what is watched, until all
    are settled or `deadline` (the loop's clock) passes; a reviewer's edit adds its
    replacement to `watched`."""
    loop = asyncio.get_running_loop()
    while not all(settled(c) for c in calls):
        replacements = {str(answer_of(c).pk) for c in calls} - watched
        if replacements:  # a reviewer's edit: the replacement answers from now on
            watched |= replacements
            calls = await reload()  # (what it did before it was watched is read now)
            continue
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        if await wakeup.wait(remaining) and wakeups.needs_read(wakeup.take_news(), watched, quiet):
            calls = await reload()
    return calls


def agent_of(request: HttpRequest) -> Agent:
    """The agent the bearer token authenticated (set by AgentToken)."""
    return request.auth  # type: ignore[attr-defined,no-any-return]


class HeldSlot:
    """A waiting request's wait slot (dispatcher.limits), given back once: by the read that
    finds every call done (`reloader`: on that read's own trip to the request's thread, a
    hop and a wait fewer before the answer), else by the request when its wait ends."""

    def __init__(self, value: str | None) -> None:
        self.value = value
        self._lock = threading.Lock()

    def give_back(self) -> None:
        with self._lock:
            slot, self.value = self.value, None
        if slot is not None:
            limits.release_wait(slot)


async def slot_taken[T](work: Awaitable[T], slot_of: Callable[[T], str | None]) -> T:
    """`work`'s answer, work that takes a wait slot on a thread (`slot_of` finds it in the
    answer). When the request is cancelled (its client gone: Django cancels the view)
    before the answer arrives, the thread still takes the slot: it is given back once
    the answer arrives, not held until it lapses (the wait's seconds and a minute on)."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(functools.partial(_give_back_taken, slot_of))
        raise


def _give_back_taken[T](slot_of: Callable[[T], str | None], done: asyncio.Future[T]) -> None:
    if done.cancelled() or done.exception() is not None:
        return
    if (slot := slot_of(done.result())) is not None:
        done.get_loop().run_in_executor(None, limits.release_wait, slot)


def reloader(
    call_ids: list[str], slot: HeldSlot | None = None
) -> Callable[[], Awaitable[list[ToolCall]]]:
    """The calls' read, for `wait_until_terminal` (its default `settled`, is_done, when
    `slot` is given: the read that finds them all done gives the slot back)."""
    return sync_to_async(functools.partial(_reload, call_ids, slot))


def _session_for(agent: Agent, session_id: UUID) -> AgentSession | None:
    # (A session it ran for a team it has left is that team's, AgentSession.team, even once
    # it is back: AgentSession.left_at.)
    session = AgentSession.objects.filter(
        pk=session_id, agent=agent, team_id=agent.team_id, left_at__isnull=True
    ).first()
    if session is not None:
        session.agent = agent
    return session


# Read again after every wake-up (floor.compiled; one plan per number of calls).
_CALLS = Compiled(lambda ids: ToolCall.objects.filter(pk__in=ids).order_by())


def _reload(call_ids: list[str], slot: HeldSlot | None = None) -> list[ToolCall]:
    """The calls, read again (an edited call followed to its replacement); then the
    request's database connection is given back (to the pool), so that a waiting request
    holds none: waits never exhaust the pool. When they are all done, `slot` is given
    back here: the wait ends with this read."""
    try:
        by_id = {str(c.pk): c for c in _CALLS.all([UUID(c) for c in call_ids])}
        calls = [by_id[cid] for cid in call_ids]
        follow_edits(calls)
        if slot is not None and all(is_done(c) for c in calls):
            slot.give_back()
        return calls
    finally:
        if not connection.in_atomic_block:  # (the test client's wrapping transaction)
            connection.close()


def _submit(
    token: str, session_id: UUID, request: HttpRequest, seconds: float = 0
) -> tuple[str, list[ToolCall], str | None] | JsonResponse:
    """Verify the token (with the session, in one read), then read the body: an unknown
    token is answered 401 before anything it sent is parsed. With `seconds` to wait, one
    of the agent's wait slots is taken first (it is returned; 429 when none is free)."""
    waits = seconds > 0
    session = agents.session_for_token(token, session_id)
    if session is None:
        if agents.authenticate_token(token) is None:
            return refused(token)
        return error(
            404,
            "unknown_session",
            f"Session {session_id} does not exist, belongs to another agent, or was started "
            "for a team the agent has left (start a new session).",
        )
    try:
        limits.take_request(session.agent, token)
    except limits.TooManyRequests as refusal:
        return too_many_requests(refusal)
    slot = None
    if waits:
        taken = reserve_wait(session.agent, seconds)
        if isinstance(taken, limits.TooManyWaits):
            return too_many_waits(taken)
        slot = taken
    try:
        outcome = _read_and_admit(session, request)
    except BaseException:
        if slot is not None:
            limits.release_wait(slot)
        raise
    if isinstance(outcome, JsonResponse):
        if slot is not None:
            limits.release_wait(slot)
        return outcome
    if waits and not connection.in_atomic_block:  # (the test client's wrapping transaction)
        connection.close()  # back to the pool: a waiting request holds no connection
    return (*outcome, slot)


def _read_and_admit(
    session: AgentSession, request: HttpRequest
) -> tuple[str, list[ToolCall]] | JsonResponse:
    try:
        body = read_json(request)
    except BodyError as exc:
        return exc.response
    try:
        dialect, proposed = parse_submission(body)
    except DialectError as exc:
        return error(422, "unrecognized_body", str(exc))
    if len(proposed) > settings.HARNESS_MAX_CALLS_PER_BATCH:
        return error(
            413,
            "too_many_calls",
            f"At most {settings.HARNESS_MAX_CALLS_PER_BATCH} calls per message.",
        )
    calls = admission.submit_calls(
        session=session, dialect=dialect, proposed=proposed, profile_preloaded=True
    )
    follow_edits(calls)
    return dialect, calls


# --- Endpoints ----------------------------------------------------------------------------

SUBMISSION_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "description": "One assistant message's tool calls: an OpenAI assistant message "
                    "(tool_calls), an Anthropic assistant message (content with tool_use blocks), "
                    'or {"calls": [{"id", "name", "arguments"}]}.',
                    "type": "object",
                }
            }
        },
    }
}


@api.post(
    "/sessions/{session_id}/calls",
    auth=SubmitToken(),
    openapi_extra=SUBMISSION_DOC,
    summary="Submit tool calls",
)
async def submit_calls(request: HttpRequest, session_id: UUID, wait: float = 0) -> HttpResponse:
    """Submit one assistant message's calls; wait up to `wait` seconds (max 60) for results.

    200 when every call is terminal, else 202. Resubmitting the same message creates
    nothing new and answers with the batch's current state: that is how to wait for the rest.
    """
    token: str = request.auth  # type: ignore[attr-defined]  # verified by _submit
    seconds = clamp_wait(wait)
    # When this process is subscribed to the session's channel already (the agent's last
    # call waited here moments ago), wait on it from before the calls are written: then
    # nothing needs reading again before sleeping. Joining asks Redis nothing.
    joined = wakeups.join_subscribed(session_channel(str(session_id))) if seconds > 0 else None
    served = False  # (a refused request leaves the channel as it found it)
    try:
        outcome = await slot_taken(
            sync_to_async(_submit)(token, session_id, request, seconds),
            lambda outcome: outcome[2] if isinstance(outcome, tuple) else None,
        )
        if isinstance(outcome, JsonResponse):
            return outcome
        served = True
        dialect, calls, slot = outcome
        ids = [str(c.pk) for c in calls]
        held = HeldSlot(slot)
        try:
            calls = await wait_until_terminal(
                ids, seconds, reloader(ids, held), calls, joined=joined
            )
        finally:
            if held.value is not None:  # (the last read gave it back if the calls are done)
                release = sync_to_async(held.give_back, thread_sensitive=False)
                await asyncio.shield(release())
    finally:
        if joined is not None:
            await joined.leave(served=served)
    status, payload = batch_json(calls, dialect)
    return JsonResponse(payload, status=status)


def _agent_call(agent: Agent, call_id: UUID) -> ToolCall | None:
    call = ToolCall.objects.filter(
        pk=call_id,
        session__agent=agent,
        session__team_id=agent.team_id,
        session__left_at__isnull=True,
    ).first()
    if call is not None:
        follow_edits([call])
    return call


@api.get("/calls/{call_id}", summary="One call")
async def get_call(request: HttpRequest, call_id: UUID, wait: float = 0) -> HttpResponse:
    call = await sync_to_async(_agent_call)(agent_of(request), call_id)
    if call is None:
        return error(
            404,
            "unknown_call",
            f"Call {call_id} does not exist, belongs to another agent, or was made for a "
            "team the agent has left.",
        )
    seconds = clamp_wait(wait)
    if seconds <= 0 or call.status in TERMINAL_STATUSES:
        return JsonResponse(call_json(call))
    slot = await slot_taken(
        sync_to_async(reserve_wait, thread_sensitive=False)(agent_of(request), seconds),
        lambda slot: slot if isinstance(slot, str) else None,
    )
    if isinstance(slot, limits.TooManyWaits):
        return too_many_waits(slot)
    ids = [str(call.pk)]
    held = HeldSlot(slot)
    try:
        calls = await wait_until_terminal(ids, seconds, reloader(ids, held), [call])
    finally:
        if held.value is not None:  # (the last read gave it back if the call is done)
            await asyncio.shield(sync_to_async(held.give_back, thread_sensitive=False)())
    return JsonResponse(call_json(calls[0]))


def _cancel(agent: Agent, call_id: UUID) -> ToolCall | JsonResponse:
    call = _agent_call(agent, call_id)
    if call is None:
        return error(
            404,
            "unknown_call",
            f"Call {call_id} does not exist, belongs to another agent, or was made for a "
            "team the agent has left.",
        )
    if not transitions.cancel_call(
        # An edited call is cancelled through the call that replaced it.
        call_id=answer_of(call).pk,
        actor=f"agent:{agent.name}",
        reason="Cancelled by the agent.",
    ):
        call.refresh_from_db()
        follow_edits([call])
        return error(
            409,
            "not_pending",
            f"The call is {answer_of(call).status}; only a call pending approval can be cancelled.",
        )
    call.refresh_from_db()
    follow_edits([call])
    return call


@api.post("/calls/{call_id}/cancel", summary="Cancel a call pending approval")
async def cancel_call(request: HttpRequest, call_id: UUID) -> HttpResponse:
    outcome = await sync_to_async(_cancel)(agent_of(request), call_id)
    return outcome if isinstance(outcome, JsonResponse) else JsonResponse(call_json(outcome))


class SessionIn(Schema):
    title: str = ""
    mode: Mode | None = None


def session_json(session: AgentSession, calls: list[ToolCall] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": str(session.pk),
        "agent": session.agent.name,
        "title": session.title,
        "mode": session.mode,
        "workspace": session.workspace,
        "created_at": session.created_at.isoformat(),
        "url": f"/api/v1/sessions/{session.pk}",
    }
    if calls is not None:
        data["calls"] = [call_json(c) for c in calls]
    return data


def _start(agent: Agent, body: Any) -> dict[str, Any] | JsonResponse:
    if not isinstance(body, dict):
        return error(
            422, "invalid_request", 'Send a JSON object: {"title"?: string, "mode"?: string}.'
        )
    try:
        data = SessionIn.model_validate(body)
    except Exception as exc:  # pydantic's error names the bad field
        return error(422, "invalid_request", f"Invalid session request: {exc}")
    try:
        session = agents.start_session(agent=agent, title=data.title, mode=data.mode)
    except limits.TooManySessions as refusal:
        return too_many_sessions(refusal)
    except errors.ServiceError as exc:
        return error(422, "invalid_request", str(exc))
    return session_json(session)


@api.post(
    "/sessions",
    summary="Start a session",
    openapi_extra={
        "requestBody": {"content": {"application/json": {"schema": SessionIn.model_json_schema()}}}
    },
)
async def start_session(request: HttpRequest) -> HttpResponse:
    try:
        body = read_json(request)
    except BodyError as exc:
        return exc.response
    outcome = await sync_to_async(_start)(agent_of(request), body)
    return outcome if isinstance(outcome, JsonResponse) else JsonResponse(outcome, status=201)


def _session_detail(agent: Agent, session_id: UUID) -> dict[str, Any] | None:
    session = _session_for(agent, session_id)
    if session is None:
        return None
    calls = list(session.calls.order_by("created_at", "batch_index"))
    follow_edits(calls)
    return session_json(session, calls)


@api.get("/sessions/{session_id}", summary="A session with its calls")
async def get_session(request: HttpRequest, session_id: UUID) -> HttpResponse:
    data = await sync_to_async(_session_detail)(agent_of(request), session_id)
    if data is None:
        return error(
            404,
            "unknown_session",
            f"Session {session_id} does not exist, belongs to another agent, or was started "
            "for a team the agent has left (start a new session).",
        )
    return JsonResponse(data)


@api.get("/tools", summary="The model-facing tool list")
async def list_tools(request: HttpRequest, format: str = "native") -> HttpResponse:
    if format not in ("native", "openai", "anthropic"):
        return error(
            400, "unknown_format", f"Unknown format '{format}'. Use native, openai or anthropic."
        )
    # all_tools reads the upstream MCP servers' tools (a database read): on the ORM thread.
    # (the agent's team's and the organization's servers only)
    tools = await sync_to_async(all_tools)(agent_of(request).team_id)
    return JsonResponse([model_facing_schema(tool, format) for tool in tools], safe=False)


__all__ = ["api", "Status"]
