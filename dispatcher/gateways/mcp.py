"""The MCP gateway (docs/mcp.md), its protocol: the official `mcp` SDK's low-level
`Server` with Harness's handlers. The HTTP side (authentication, sessions, the SDK's
Streamable HTTP transport per request) is `dispatcher.gateways.mcp_http`.

`tools/list` is the model-facing projection (`model_facing_schema(tool, "mcp")`) of the
tools Harness offers, paginated; `tools/call` is a call through all ten stages
(`admission.submit_calls`), its `tool_use_id` made of the JSON-RPC request id, so a
retried request finds its call. An ask holds the request open, sending progress
notifications that name the reviewer page when the client asked for progress, and
sleeping on the call's wake channel in between; `notifications/cancelled` for it cancels
the call (mcp_http reads it before the SDK sees the message: the call may be held by
another process). `approval_prompt` is Claude Code's `--permission-prompt-tool`: a
decide-only call of the client's tool, answered allow (with the same input) or deny.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import anyio
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.urls import reverse
from mcp import types
from mcp.server import Server, ServerRequestContext
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from dispatcher import admission, agents, execution, limits, pipeline, transitions, wakeups
from dispatcher.answers import answer_content, answer_of, follow_edits, is_done
from dispatcher.gateways.dialects import MAX_ID_LENGTH, UnstorableJSON, check_storable
from dispatcher.models import Agent, AgentSession, Dialect, Status, ToolCall
from dispatcher.policy import rules
from dispatcher.policy.context import CallContext
from dispatcher.policy.models import Mode
from dispatcher.proposals import ProposedCall, canonical_json, digest_of
from dispatcher.tools import client_tool
from dispatcher.tools.base import model_facing_schema
from dispatcher.tools.registry import all_tools, get_tool, one_generation
from dispatcher.wakeups import session_channel
from floor import redis_clients
from floor.threads import ProcessThreads

logger = logging.getLogger(__name__)

CLIENT = "mcp"
APPROVAL_PROMPT = "approval_prompt"


@dataclass(frozen=True)
class Caller:
    """Who sent the request being served, and where: set for each request."""

    agent: Agent
    session: AgentSession
    base_url: str
    # The session was read with the owner's profile and its grants (agents.
    # loaded_client_session): admission reads neither again.
    loaded: bool = False
    # Which of the run's transport sessions (or sessionless requests) sent it: request ids
    # are unique only within one (docs/mcp.md, "Which session a request joins").
    transport: str = ""


_caller: contextvars.ContextVar[Caller] = contextvars.ContextVar("mcp_caller")


@contextlib.contextmanager
def caller_context(caller: Caller) -> Iterator[None]:
    """`caller` is who the handlers serve while the request's server runs inside this."""
    token = _caller.set(caller)
    try:
        yield
    finally:
        _caller.reset(token)


# The gateway's ORM work runs on one pool of threads per process, reused request after
# request. (A thread of its own per request, asgiref's ThreadSensitiveContext as Django's
# handler uses, cost more CPU to start and end than the admission it ran: docs/
# benchmarks.md, S14.) Each piece of work gives its database connection back when it
# ends, so a thread holds none between requests. A call run inline is awaited on its
# request's loop between two trips here (admission, then its result: `run_pending`), so
# a call whose server hangs holds no thread; only under a deployment's execute wrapper
# (pipeline.runs_on_loop) does it run on its admission's thread, holding it while its
# server answers, and past ORM_THREADS such requests at once the next wait for a thread.
ORM_THREADS = limits.MCP_ORM_THREADS
orm_threads = ProcessThreads(ORM_THREADS, "mcp-orm")


def db[**P, R](function: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """`function` on one of the gateway's ORM threads, handing its connection back
    afterwards (this app runs outside Django's handler, which would otherwise do it).
    Wrapped once per function (the gateway's few), and handed to the process's threads
    by one runner per pool of threads (a fork gets its own): building asgiref's runner
    for every trip cost about a tenth of the trip's own CPU."""
    wrapped = _on_threads.get(function)
    if wrapped is None:
        wrapped = _on_threads.setdefault(function, _wrap(function))
    return cast(Callable[P, Awaitable[R]], wrapped)


# The gateway's functions as `db` wraps them.
_on_threads: dict[Callable[..., Any], Any] = {}


def _wrap[**P, R](function: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    @functools.wraps(function)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        finally:
            close_old_connections()

    runners: dict[ThreadPoolExecutor, Callable[P, Awaitable[R]]] = {}

    @functools.wraps(function)
    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        executor = orm_threads()
        runner = runners.get(executor)
        if runner is None:
            # (sync_to_async's own executor argument, which keeps the caller's context vars)
            runners.clear()  # (a fork's pool replaces its parent's)
            runner = runners[executor] = sync_to_async(
                run, thread_sensitive=False, executor=executor
            )
        return await runner(*args, **kwargs)

    return call


# --- The protocol: the SDK's low-level server with Harness's handlers ----------------------

server: Server[Any] = Server(
    "harness",
    instructions=(
        "Tool calls are decided by Harness: policy, and for some calls a human reviewer. "
        "A call waiting for a reviewer stays open until it is decided."
    ),
)

APPROVAL_PROMPT_TOOL = types.Tool(
    name=APPROVAL_PROMPT,
    description=(
        "Claude Code's permission prompt (--permission-prompt-tool): asks Harness whether the "
        "client may run one of its own tools with this input. Answers a JSON text "
        '{"behavior": "allow", "updatedInput": ...} or {"behavior": "deny", "message": ...}.'
    ),
    input_schema={
        "type": "object",
        "properties": {
            "tool_name": {"type": "string"},
            "input": {"type": "object"},
            "tool_use_id": {"type": "string"},
        },
        "required": ["tool_name", "input"],
    },
    annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
)


def offered_tools(session: AgentSession) -> list[types.Tool]:
    """What this session's client is offered: the tools Harness runs that the session may
    ever use, by the one allowlist function, then the permission prompt.

    Left out: client-executed tools (the client's own), every tool in locked mode, tools
    that can change things in read_only mode (the mode ceiling denies them whatever a rule
    says), tools of another team's MCP servers, and tools a deny list of any layer names
    without a specifier. Admission still
    decides each call; this only spares the model tools that can never run.
    """
    mode, profile = agents.mode_and_profile(session)
    denied = set()
    for text in (*profile.deny, *(t for layer in profile.layers for t in layer.deny)):
        with contextlib.suppress(rules.RuleError):
            rule = rules.parse_rule(text)
            if rule.specifier is None:
                denied.add(rule.tool)
    tools = [
        types.Tool.model_validate(model_facing_schema(tool, "mcp"))
        for tool in all_tools(session.agent.team_id)
        if not tool.client_executed
        and tool.name not in denied
        and mode != Mode.LOCKED
        and (mode != Mode.READ_ONLY or tool.read_only)
    ]
    # approval_prompt first: a client that reads only the first tools still finds it.
    return [APPROVAL_PROMPT_TOOL, *tools]


async def list_tools(
    context: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    """One page of the offered tools; `nextCursor` names the next page."""
    cursor = params.cursor if params else None
    start = 0
    if cursor:
        try:
            start = int(cursor)
        except ValueError:
            start = -1
        if start < 0:
            raise refuse(
                types.INVALID_PARAMS,
                f"Invalid cursor {cursor!r}: pass back a nextCursor from tools/list.",
            )
    tools = await db(offered_tools)(_caller.get().session)
    size = settings.HARNESS_MCP_PAGE_SIZE
    page = tools[start : start + size]
    more = start + size < len(tools)
    return types.ListToolsResult(tools=page, next_cursor=str(start + size) if more else None)


def refuse(code: int, message: str) -> MCPError:
    return MCPError(code=code, message=message)


def storable(name: str, arguments: dict[str, Any]) -> None:
    """What the agent API refuses with 422 is refused here as invalid params: nothing is
    recorded. Raises MCPError."""
    if not name or len(name) > MAX_ID_LENGTH:
        raise refuse(
            types.INVALID_PARAMS, f"The tool name must be 1 to {MAX_ID_LENGTH} characters."
        )
    try:
        check_storable([name, arguments])  # (a NUL in the name: the database refuses it)
    except (UnstorableJSON, RecursionError) as exc:
        text = str(exc) or "The arguments are nested too deeply; send a flatter object."
        raise refuse(types.INVALID_PARAMS, text) from None


# The JSON-RPC error of a call refused for the agent's wait cap (implementation-defined
# server error range): nothing of it was recorded.
TOO_MANY_WAITS = -32029
# How long past an approval's life a held call's slot lasts if never given back (its run).
HOLD_RUN_MARGIN = 3600.0


class WaitSlot:
    """One of the agent's wait slots (dispatcher.limits) for one tools/call request: taken
    on the admission's own trip to an ORM thread (`take`), before anything is recorded,
    and given back when the call is done at once (denied or rejected: on that trip;
    allowed and run inline: on its result's trip, `finish`), else by the request when it
    ends; by whichever comes last when the request ends while its admission is still
    running (an inline call's admission lasts until its result is written: a request
    cancelled meanwhile, as daphne cancels one 10 s after its client hung up, leaves the
    slot taken until the call ends)."""

    def __init__(self, agent: Agent | None, seconds: float) -> None:
        # (None until the request's token is read: an early admission's, EarlyAdmission)
        self.agent, self.seconds = agent, seconds
        self.value: str | None = None
        self.ended = False
        self.admitting = False
        self.lock = threading.Lock()

    def take(self) -> None:
        """Raises MCPError (TOO_MANY_WAITS) when the agent, or its person's agents
        together, hold all of their slots."""
        assert self.agent is not None
        try:
            slot = limits.reserve_wait(self.agent, self.seconds)
        except limits.TooManyWaits as full:
            raise MCPError(
                code=TOO_MANY_WAITS,
                message=full.message(
                    "Nothing of this request was recorded. Wait until one of its calls "
                    "is answered, then send it again (retry after "
                    f"{limits.retry_after_wait()} s)."
                ),
                data={"retry_after": limits.retry_after_wait()},
            ) from None
        with self.lock:
            ended = self.ended
            if not ended:
                self.value, self.admitting = slot, True
        if ended:  # the request ended before its admission began: nothing is admitted
            limits.release_wait(slot)
            raise refuse(
                types.INVALID_REQUEST,
                "The request ended before its call was admitted; nothing was recorded.",
            )

    def admission_ended(self, done: bool) -> None:
        """The admission (and the call's inline run) ended: the slot is given back when
        the call is `done` or the request has ended meanwhile."""
        with self.lock:
            self.admitting = False
            slot = self._detach() if done or self.ended else None
        if slot is not None:
            limits.release_wait(slot)

    def request_ended(self) -> str | None:
        """The request ended: the slot it gives back (`limits.release_wait`), or None when
        it holds none or its admission still runs (`admission_ended` gives it back)."""
        with self.lock:
            self.ended = True
            return None if self.admitting else self._detach()

    def _detach(self) -> str | None:
        """The slot, once (under `lock`)."""
        slot, self.value = self.value, None
        return slot


async def call_tool(
    context: ServerRequestContext[Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    """The SDK's tools/call handler."""
    assert context.request_id is not None  # (a request, never a notification)
    caller = _caller.get()
    return await answer_call(context.request_id, params, Progress.of(context, caller))


def hold_seconds() -> float:
    """How long a request's wait slot lasts if never given back: a held call may wait for a
    reviewer as long as an approval lives, then for its run."""
    return settings.HARNESS_APPROVAL_TIMEOUT + HOLD_RUN_MARGIN


async def answer_call(
    request_id: types.RequestId,
    params: types.CallToolRequestParams,
    progress: Progress,
    early: EarlyAdmission | None = None,
) -> types.CallToolResult:
    """A tools/call request's result: what the SDK's handler (`call_tool`) and the fast
    path (`mcp_fast`, a request that needs no stream of its own) both answer. Raises
    MCPError for what the client reads as a JSON-RPC error. `early`: the fast path's call
    admitted on its authentication's trip (its name storable, not the permission prompt)."""
    name, arguments = params.name, params.arguments or {}
    if early is None:
        storable(name, arguments)
        slot = WaitSlot(progress.caller.agent, hold_seconds())
    else:
        slot = early.slot
    try:
        if early is not None:
            call = await early.call()
            call = await hold(call, progress, settled=is_done)  # a reviewer's edit is followed
            return tool_result(call)
        return await admit_and_hold(request_id, progress, name, arguments, slot)
    except DatabaseError:
        logger.exception("MCP gateway storage error")
        raise refuse(
            types.INTERNAL_ERROR,
            "Harness could not record this call (its database refused the write), so nothing "
            "was decided or run. Send the same request again later.",
        ) from None
    finally:  # (shielded: a cancelled request still gives its slot back)
        if (held := slot.request_ended()) is not None:
            release = sync_to_async(limits.release_wait, thread_sensitive=False)
            await asyncio.shield(release(held))


async def admit_and_hold(
    request_id: types.RequestId,
    progress: Progress,
    name: str,
    arguments: dict[str, Any],
    slot: WaitSlot | None = None,
) -> types.CallToolResult:
    """The call admitted (and run, in the inline lane), then held until it is done.
    `slot`: the request's wait slot, taken on the admission's trip to an ORM thread and
    (when the call is done at once) given back there or on its result's (`WaitSlot`)."""
    caller = progress.caller
    tool_use_id = mcp_tool_use_id(request_id, caller.transport)
    if name == APPROVAL_PROMPT:
        return await approval_prompt(caller, arguments, tool_use_id, progress, slot)
    proposed = ProposedCall(tool_use_id, name, canonical_json(arguments), arguments)
    call = await admitted(caller, proposed, slot)
    call = await hold(call, progress, settled=is_done)  # a reviewer's edit is followed
    return tool_result(call)


async def admitted(caller: Caller, proposed: ProposedCall, slot: WaitSlot | None) -> ToolCall:
    """`admit` (and the run of a call it kept for the loop, and its result), finished even
    when the request is cancelled meanwhile, as daphne cancels one 10 s after its client
    hung up (an ORM trip that has taken its slot records the call anyway, and a call
    claimed for the inline lane is run and its result written; a trip that starts after
    the request ended records nothing: `WaitSlot.take`): the cancellation then reaches
    `hold`, which cancels the call on 2026-07-28, so a client that closed its stream
    during the admission leaves no call waiting for a reviewer on its behalf."""
    work = asyncio.ensure_future(_admit_and_run(caller, proposed, slot))
    _admitting.add(work)  # (the loop keeps only a weak reference to a task)
    work.add_done_callback(_settled)
    with anyio.CancelScope(shield=True):
        call = await asyncio.shield(work)
    return call


# The admissions (and inline runs) under way on this process's loops, kept to their end.
_admitting: set[asyncio.Future[Any]] = set()


def _settled(work: asyncio.Future[Any]) -> None:
    """An admission's end: what it raised is the request's, if the request still waits
    (read here too, for a request cancelled meanwhile: nothing is left unread)."""
    _admitting.discard(work)
    if not work.cancelled():
        work.exception()


async def _admit_and_run(caller: Caller, proposed: ProposedCall, slot: WaitSlot | None) -> ToolCall:
    loop = asyncio.get_running_loop()  # (a call run inline makes its request here)
    call, pending = await db(admit)(
        caller.session, proposed, preloaded=caller.loaded, slot=slot, loop=loop, on_loop=True
    )
    if pending is not None:
        call = await run_pending(call, pending, slot)
    return call


# --- A fast-path call admitted on its authentication's trip -------------------------------

# What a request's authentication read: the agent (None: a bad token), the agent's session
# it names (None: none), the rate's refusal (None: counted).
Authenticated = tuple[Agent | None, AgentSession | None, limits.TooManyRequests | None]


class EarlyAdmission:
    """A tools/call the fast path will answer (mcp_fast), admitted on the trip to an ORM
    thread that authenticates its request (mcp_http.serve): one trip fewer per call
    (docs/benchmarks.md, "The MCP allowed call's ORM trips"). On that thread, in the order
    the request's own trips keep: the token and the session it names are read and the
    request is taken from the agent's rate (`authenticate`); only when all three pass is
    the call admitted, its wait slot taken first, exactly as its own trip would have
    admitted it a moment later (`admit`). A request they refuse (a bad token, an unknown or
    ended session, the rate) admits nothing and is answered as before.

    The trip, and the run of a call it kept for the loop with its result's trip, are one
    task kept to its end whatever happens to the request (as `admitted` keeps an
    admission); the request gives the slot back when it ends (`request_ended`)."""

    def __init__(
        self, request_id: types.RequestId, params: types.CallToolRequestParams, transport: str
    ) -> None:
        arguments = params.arguments or {}
        tool_use_id = mcp_tool_use_id(request_id, transport)
        self.proposed = ProposedCall(tool_use_id, params.name, canonical_json(arguments), arguments)
        self.slot = WaitSlot(None, hold_seconds())
        self.authenticated: asyncio.Future[Authenticated] = (
            asyncio.get_running_loop().create_future()
        )
        self.work: asyncio.Future[ToolCall | None] | None = None

    async def start(self, authenticate: Callable[[], Authenticated]) -> Authenticated:
        """The request's authentication (`authenticate`, run on the trip), its call admitted
        on the same trip when it passes."""
        work = self.work = asyncio.ensure_future(self._run(authenticate))
        _admitting.add(work)  # (the loop keeps only a weak reference to a task)
        work.add_done_callback(_settled)
        return await asyncio.shield(self.authenticated)

    async def _run(self, authenticate: Callable[[], Authenticated]) -> ToolCall | None:
        loop = asyncio.get_running_loop()
        try:
            found, admitted = await db(admit_early)(self, authenticate, loop)
        except BaseException as exc:
            if not self.authenticated.done():  # (its reader raises it: a 503, as before)
                self.authenticated.set_exception(exc)
                self.authenticated.add_done_callback(_read)
            raise
        if not self.authenticated.done():
            self.authenticated.set_result(found)
        if admitted is None:
            return None
        if isinstance(admitted, BaseException):
            raise admitted  # (the request's: `call` raises it where the request waits)
        call, pending = admitted
        if pending is not None:
            call = await run_pending(call, pending, self.slot)
        return call

    async def call(self) -> ToolCall:
        """The admitted call (run, when the inline lane kept it), awaited even when the
        request is cancelled meanwhile (`admitted`)."""
        assert self.work is not None
        with anyio.CancelScope(shield=True):
            call = await asyncio.shield(self.work)
        assert call is not None  # (asked for only once the request was authenticated)
        return call

    async def request_ended(self) -> None:
        """The request ended: its slot given back unless its admission still runs (which
        then gives it back), or it was given back already."""
        if (held := self.slot.request_ended()) is not None:
            release = sync_to_async(limits.release_wait, thread_sensitive=False)
            await asyncio.shield(release(held))


def admit_early(
    early: EarlyAdmission,
    authenticate: Callable[[], Authenticated],
    loop: asyncio.AbstractEventLoop,
) -> tuple[Authenticated, tuple[ToolCall, Pending | None] | Exception | None]:
    """`early`'s trip: the request authenticated, then its call admitted (`admit`, for the
    loop) when the token, the session and the rate all pass; what `admit` raised is the
    call's answer (an exception of the authentication is the request's: raised)."""
    found = authenticate()
    agent, session, refusal = found
    if agent is None or session is None or refusal is not None:
        return found, None
    early.slot.agent = agent
    try:
        return found, admit(
            session, early.proposed, preloaded=True, slot=early.slot, loop=loop, on_loop=True
        )
    except Exception as exc:  # noqa: BLE001 - the call's answer, raised where it is awaited
        return found, exc


def _read(future: asyncio.Future[Any]) -> None:
    """A future's exception read (a request cancelled before it read it leaves no warning)."""
    if not future.cancelled():
        future.exception()


server.add_request_handler("tools/list", types.PaginatedRequestParams, list_tools)
server.add_request_handler("tools/call", types.CallToolRequestParams, call_tool)


def mcp_tool_use_id(request_id: types.RequestId, transport: str = "") -> str:
    """The call's id in its session: the JSON-RPC request id (an int 5 and a string "5"
    stay apart), within the transport session that sent it when the run has several. A
    client that sends the same request again on the same transport finds the same call."""
    text = "mcp:" + (transport + ":" if transport else "") + json.dumps(request_id)
    if len(text) > 160:  # a long string id: its digest keeps it one id, and storable
        text = "mcp:sha256:" + hashlib.sha256(text.encode()).hexdigest()
    return text


def submit(
    session: AgentSession,
    proposed: ProposedCall,
    *,
    preloaded: bool = False,
    slot: WaitSlot | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
) -> ToolCall:
    """The call (a request sent again finds its call, perhaps edited since: followed).
    `preloaded`: the session was read with its owner's profile (Caller.loaded). A call
    allowed at once whose tool may run in this process is run now, on this thread (the
    inline lane: admission.admit_message, execution.run_inline), its upstream request
    made on `loop`, the request's own event loop, which awaits this. `slot`: the
    request's wait slot, taken first (MCPError when none is free: nothing recorded),
    given back here when the call is done.

    Raises MCPError when the request id names an earlier call with another tool or other
    arguments: that call's decision and result are not this request's."""
    call, pending = admit(session, proposed, preloaded=preloaded, slot=slot, loop=loop)
    assert pending is None
    return call


# A call admitted and claimed for the inline lane whose body the request awaits on its
# own loop (pipeline.runs_on_loop): the call, and what policy saw of it.
Pending = tuple[ToolCall, CallContext]


def admit(
    session: AgentSession,
    proposed: ProposedCall,
    *,
    preloaded: bool = False,
    slot: WaitSlot | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
    on_loop: bool = False,
) -> tuple[ToolCall, Pending | None]:
    """`submit`; `on_loop`: a call kept for the inline lane whose tool runs on the loop
    (pipeline.runs_on_loop) is not run here but returned, claimed, for the request to
    await on its loop (`run_pending`) and then `finish` on a thread; its admission (and
    `slot`'s) ends there."""
    if slot is not None:
        slot.take()
    done = False
    pending: Pending | None = None
    try:
        with one_generation():  # (its admission and its inline run: one list of tools)
            [call], kept = admission.admit_message(
                session=session,
                dialect=Dialect.MCP,
                proposed=[proposed],
                profile_preloaded=preloaded,
                inline=True,
            )
            if call.name != proposed.name or call.digest != digest_of(proposed):
                raise refuse(
                    types.INVALID_PARAMS,
                    "This request id was already used in this session for another call; Harness "
                    "decides each input once. Send the call again with a new request id.",
                )
            for claimed, ctx in kept:  # allowed, claimed, and it may run here: it runs now
                if on_loop and pipeline.runs_on_loop(ctx.tool):
                    pending = (claimed, ctx)
                    continue
                _recorded(claimed, functools.partial(execution.run_inline, claimed, ctx, loop))
        if pending is None:
            follow_edits([call])
            done = is_done(call)  # nothing to wait for: given back on this trip
        return call, pending
    finally:
        if slot is not None and pending is None:
            slot.admission_ended(done)


async def run_pending(call: ToolCall, pending: Pending, slot: WaitSlot | None) -> ToolCall:
    """The body of a call `admit` kept for the loop, awaited here (on the request's loop,
    no thread held while its server answers), then its result written (`finish`, on an
    ORM thread), which ends its admission."""
    claimed, ctx = pending
    try:
        outcome, seconds = await execution.run_body_async(claimed, ctx)
        return await db(finish)(call, pending, outcome, seconds, slot)
    except BaseException:
        # (the loop shutting down: the call's lease ends it; its slot is given back now,
        # not when it lapses, as `finish` would have)
        if slot is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(asyncio.to_thread(slot.admission_ended, False))
        raise


def _recorded(claimed: ToolCall, run: Callable[[], None]) -> None:
    """`run`, which writes the inline call's result. When it cannot, the call is still
    running in the database and its lease ends it as outcome_unknown; the request waits
    for that."""
    try:
        run()
    except Exception:
        logger.exception("call %s ran inline; its result was not recorded", claimed.pk)
        claimed.status = Status.RUNNING


def finish(
    call: ToolCall,
    pending: Pending,
    outcome: pipeline.Outcome,
    seconds: float,
    slot: WaitSlot | None,
) -> ToolCall:
    """Stages 7 to 10 of a call run on the loop (`run_pending`), and its admission's end:
    `slot` given back when the call is done. The result's wake-up (after its commit) and
    the slot's release go to Redis in one round trip, before the request answers."""
    claimed, ctx = pending
    done = False
    with redis_clients.one_round_trip(settings.REDIS_URL):
        try:
            _recorded(
                claimed, lambda: execution.record_result(claimed, ctx, outcome, seconds=seconds)
            )
            follow_edits([call])
            done = is_done(call)
            return call
        finally:
            if slot is not None:
                slot.admission_ended(done)


def tool_result(call: ToolCall) -> types.CallToolResult:
    """The call's result as the model reads it in every other dialect: for a call a
    reviewer edited, the edit's note and the result of the call that replaced it."""
    answer = answer_of(call)
    meta: dict[str, Any] = {"id": str(answer.pk), "status": answer.status}
    if answer is not call:
        meta["replaces"] = str(call.pk)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=answer_content(call))],
        is_error=answer.is_error,
        _meta={"harness/call": meta},
    )


# --- Holding a call: progress while a reviewer decides, no polling -------------------------


class Progress:
    """Progress notifications for one request (only when the client sent a progressToken),
    and how the request is cancelled: on the stateless revision (2026-07-28), by closing
    its stream."""

    def __init__(
        self,
        caller: Caller,
        *,
        token: types.ProgressToken | None = None,
        session: ServerSession | None = None,
        protocol_version: str = "",
    ) -> None:
        self.token = token
        self.session = session
        self.caller = caller
        self.count = 0
        self.closing_cancels = protocol_version in MODERN_PROTOCOL_VERSIONS

    @classmethod
    def of(cls, context: ServerRequestContext[Any], caller: Caller) -> Progress:
        """For a request served by the SDK's server."""
        return cls(
            caller,
            token=(context.meta or {}).get("progress_token"),
            session=context.session,
            protocol_version=context.protocol_version,
        )

    async def waiting(self, call: ToolCall) -> None:
        if self.token is None or self.session is None:
            return
        if call.status == Status.PENDING_APPROVAL:
            page = await db(reviewer_page)(call, self.caller.base_url)
            text = f"Waiting for a reviewer to decide {call.name}: {page}"
        else:
            text = f"{call.name} is {call.status}."
        self.count += 1
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            # (on this request's own stream: its SSE response, in either era)
            await self.session.report_progress(self.count, message=text)


def reviewer_page(call: ToolCall, base_url: str) -> str:
    """The reviewer's page for the call's approval request (the queue if there is none).
    Read through the call's relation: the gateway does not know the approvals app."""
    approval_id = ToolCall.objects.filter(pk=call.pk).values_list("approval__pk", flat=True).first()
    if approval_id is None:
        return base_url + reverse("approvals:queue")
    return base_url + reverse("approvals:detail", args=[approval_id])


def reload(call_id: str) -> ToolCall:
    """The call read again, a reviewer's edits followed (`answers.follow_edits`)."""
    call = ToolCall.objects.get(pk=call_id)
    follow_edits([call])
    return call


async def hold(
    call: ToolCall, progress: Progress, *, settled: Callable[[ToolCall], bool]
) -> ToolCall:
    """Wait until `settled(call)`: asleep on the process's shared subscription to the
    call's session channel (dispatcher.wakeups), re-reading the call only when a wake-up
    says it (or the call a reviewer's edit replaced it with) changed, with a progress
    notification (and a re-read) at each change and every HARNESS_MCP_PROGRESS_INTERVAL
    seconds. Without Redis, it re-reads at that interval. Returns the call as it is
    then, edits followed."""
    if settled(call):
        return call
    try:
        return await _hold(call, progress, settled)
    except anyio.get_cancelled_exc_class():
        # The client closed the request's stream. On 2026-07-28 that is how a client
        # cancels (it has no notifications/cancelled to send): the pending call is
        # cancelled, as one named by a notification is. On earlier revisions a dropped
        # connection is not a cancellation: the call stays pending.
        if progress.closing_cancels:
            with anyio.CancelScope(shield=True):
                await db(cancel_closed)(progress.caller.agent, str(call.pk))
        raise


def cancel_closed(agent: Agent, call_id: str) -> None:
    """Cancel the call (the one a reviewer's edit replaced it with) if it still waits."""
    call = reload(call_id)
    if is_done(call):
        return
    transitions.cancel_call(
        call_id=answer_of(call).pk,
        actor=f"agent:{agent.name}",
        reason="The client closed the request (protocol 2026-07-28: its cancellation).",
    )


async def _hold(
    call: ToolCall, progress: Progress, settled: Callable[[ToolCall], bool]
) -> ToolCall:
    interval = settings.HARNESS_MCP_PROGRESS_INTERVAL
    read = db(reload)
    try:
        async with wakeups.wake_on([session_channel(str(call.session_id))]) as wakeup:
            call = await read(str(call.pk))  # a change before subscribing is not lost
            watched = {str(call.pk)}
            while not settled(call):
                watched.add(str(answer_of(call).pk))  # a replacement's changes count too
                await progress.waiting(answer_of(call))
                await _next_change(wakeup, watched, interval)
                call = await read(str(call.pk))
    except wakeups.WakeUnavailable:
        logger.warning("wake-up channel unavailable; re-reading the call", exc_info=True)
        while not settled(call):
            await progress.waiting(answer_of(call))
            await anyio.sleep(interval)
            call = await read(str(call.pk))
    return call


async def _next_change(wakeup: wakeups.Wakeup, watched: set[str], interval: float) -> None:
    """Sleep until a wake-up says a watched call changed (or says nothing readable), or
    `interval` seconds pass: changes of the session's other calls sleep on."""
    now = anyio.current_time
    until = now() + interval
    while (remaining := until - now()) > 0 and await wakeup.wait(remaining):
        if wakeups.needs_read(wakeup.take_news(), watched):
            return


# --- Claude Code's permission prompt: a decide-only call -----------------------------------


def decide_only_proposal(
    tool_name: str, tool_input: dict[str, Any], tool_use_id: str
) -> ProposedCall:
    """The proposed call for a client's tool: as itself when the registry knows it as a
    client-executed tool, else as a call of `client_tool` naming it (the one seam to
    the Claude Code tool definitions)."""
    tool = get_tool(tool_name)
    if tool is not None and tool.client_executed:
        return ProposedCall(tool_use_id, tool_name, canonical_json(tool_input), tool_input)
    arguments = {"tool_name": tool_name, "input": tool_input}
    return ProposedCall(tool_use_id, client_tool.TOOL.name, canonical_json(arguments), arguments)


async def approval_prompt(
    caller: Caller,
    arguments: dict[str, Any],
    fallback_id: str,
    progress: Progress,
    slot: WaitSlot | None = None,
) -> types.CallToolResult:
    tool_name, tool_input = arguments.get("tool_name"), arguments.get("input")
    client_id = arguments.get("tool_use_id")
    # The MCP request's id first (what a cancellation names), then the client's own; a
    # long one by its digest (ToolCall.tool_use_id holds 200 characters, and two ids that
    # differ only past a cut would be one call).
    tool_use_id = fallback_id
    if client_id:
        own = str(client_id)
        if len(fallback_id) + 1 + len(own) > 200:  # (mcp_tool_use_id: at most 160)
            own = "sha256:" + hashlib.sha256(own.encode()).hexdigest()[:32]
        tool_use_id = f"{fallback_id}/{own}"
    if not isinstance(tool_name, str) or not tool_name or not isinstance(tool_input, dict):
        return prompt_answer(
            {
                "behavior": "deny",
                "message": "approval_prompt needs tool_name (a string) and input (an object); "
                "nothing was allowed.",
            }
        )
    proposed = await db(decide_only_proposal)(tool_name, tool_input, tool_use_id)
    try:
        call = await admitted(caller, proposed, slot)
    except MCPError as reused:  # an id already decided for other input allows nothing else
        if reused.error.code == TOO_MANY_WAITS:  # (the request is refused: nothing recorded)
            raise
        return prompt_answer({"behavior": "deny", "message": reused.error.message})
    call = await hold(
        call, progress, settled=lambda c: c.status == Status.RELEASED or c.is_terminal
    )
    if call.status == Status.RELEASED:
        return prompt_answer({"behavior": "allow", "updatedInput": tool_input})
    return prompt_answer({"behavior": "deny", "message": call.content or call.reason})


def prompt_answer(answer: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(answer))])
