"""The MCP gateway's HTTP side (docs/mcp.md): Streamable HTTP at /mcp/ on the same
daphne (harness_site.asgi mounts `application`).

The protocol's server (`dispatcher.gateways.mcp.server`) runs once per request, on the
SDK's `StreamableHTTPServerTransport` for the revisions with initialize and on its
stateless session manager for 2026-07-28 (`run_transport`): daphne runs no ASGI lifespan,
so nothing here lives longer than a request, and any daphne process can serve any
request of any session, as for the agent API.

A request is authenticated with the agent's bearer token first (nothing of its body is
read before; after initialize, the token and the session it names are read in one query,
`authenticate`). Harness issues the `Mcp-Session-Id` itself when a client initializes and keeps it
as its own session's `external_id` (client "mcp"): one MCP session is one Harness session,
with its timeline, replay and export; a later request's session id is checked against the
agent's sessions. `notifications/cancelled` is read here, before the SDK sees it, so it
cancels the call whichever process holds its request.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import secrets
from dataclasses import dataclass
from typing import Any

import anyio
import pydantic
import pydantic_core
from anyio.abc import TaskStatus
from django.conf import settings
from django.db import DatabaseError
from django.db.models import Q
from django.http.request import split_domain_port, validate_host
from mcp import types
from mcp.server.connection import Connection
from mcp.server.models import InitializationOptions
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.transport_context import TransportContext
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import Message, Receive, Scope, Send

from agentauth import tokens
from dispatcher import agents, limits, transitions
from dispatcher.answers import answer_of, follow_edits
from dispatcher.gateways import mcp_fast
from dispatcher.gateways.dialects import storable_copy
from dispatcher.gateways.mcp import (
    APPROVAL_PROMPT,
    CLIENT,
    Caller,
    EarlyAdmission,
    caller_context,
    db,
    mcp_tool_use_id,
    server,
    storable,
)
from dispatcher.models import Agent, AgentSession, ToolCall

logger = logging.getLogger(__name__)

SESSION_HEADER = "mcp-session-id"


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    """The ASGI app mounted at /mcp/ (harness_site.asgi)."""
    if scope["type"] != "http":
        return
    # (The ORM work runs on the gateway's pool of threads: mcp.db.)
    try:
        await serve(scope, receive, send)
    except DatabaseError:
        # Fail closed: nothing was decided without its record. (If the response had
        # started, the connection simply ends.)
        logger.exception("MCP gateway storage error")
        with contextlib.suppress(Exception):
            await answer(
                send,
                503,
                "storage_unavailable",
                "Harness could not record this request, so nothing was decided or run. "
                "Retry it later.",
            )


async def serve(scope: Scope, receive: Receive, send: Send) -> None:
    # A header sent twice counts by its first value, as everything else reads it (the
    # router's early refusal, starlette, the SDK's transport).
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    host = headers.get("host", "")
    if not validate_host(split_domain_port(host)[0], settings.ALLOWED_HOSTS):
        return await answer(send, 400, "bad_host", f"Host {host!r} is not an allowed host.")
    kind, _, token = headers.get("authorization", "").partition(" ")
    session_id = headers.get(SESSION_HEADER, "")
    # (Only a Bearer token is looked up, as the router does: another scheme's credential
    # is answered 401 below, unheld, and must not take the request let through.)
    if kind.lower() == "bearer" and (early := limits.refused_early(token.strip(), scope)):
        return await answer(
            send, 429, "too_many_requests", str(early), {"retry-after": str(early.retry_after)}
        )
    bearer = kind.lower() == "bearer"
    # A tools/call the fast path would answer, if its session is the agent's, is read now
    # and admitted on the trip that authenticates it (EarlyAdmission).
    read = None
    version = mcp_fast.eligible_version(scope, session_id) if bearer and session_id else None
    if version is not None:
        read = early_read(await read_body(receive), session_id, version)
    if read is None or read.admission is None:
        return await serve_authenticated(scope, receive, send, host, kind, token, session_id, read)
    try:
        await serve_authenticated(scope, receive, send, host, kind, token, session_id, read)
    finally:  # (shielded: a cancelled request still gives its slot back)
        await read.admission.request_ended()


@dataclass(frozen=True)
class Read:
    """A request's body as `serve` read it before its authentication (None: past
    HARNESS_MAX_BODY_BYTES), and when the fast path may take it, its messages, its call
    and that call's admission, begun on the authentication's trip (`early_read`)."""

    body: bytes | None
    messages: list[types.JSONRPCMessage] | None = None
    fast: mcp_fast.FastCall | None = None
    admission: EarlyAdmission | None = None


# The largest body parsed before its request is authenticated, to admit its call on the
# same trip (`early_read`): S14's call is under 200 bytes. A larger one is parsed after the
# token, as before, so a request with a bad token costs at most a parse of this much.
EARLY_BODY_MAX = 16 * 1024


def early_read(body: bytes | None, session_id: str, version: str) -> Read:
    """`body`, with its call's early admission when it may have one: a body of at most
    EARLY_BODY_MAX bytes that the fast path takes if `session_id` is the agent's
    (`mcp_fast.eligible`; `version`: what `mcp_fast.eligible_version` found of its method
    and headers), calling a tool other than the permission prompt, with a name and
    arguments Harness can store. Anything else is authenticated alone and served as
    before (whatever it is answered, it is answered after the token and the session)."""
    if body is None or len(body) > EARLY_BODY_MAX:
        return Read(body)
    try:
        messages = parse_messages(body)
    except UnnamedRequest:
        return Read(body)
    fast = mcp_fast.parse(messages, version)
    if fast is None or fast.params.name == APPROVAL_PROMPT:
        return Read(body, messages)
    try:
        storable(fast.params.name, fast.params.arguments or {})
    except MCPError:
        return Read(body, messages)
    admission = EarlyAdmission(fast.request_id, fast.params, split_session_id(session_id)[1])
    return Read(body, messages, fast, admission)


async def serve_authenticated(
    scope: Scope,
    receive: Receive,
    send: Send,
    host: str,
    kind: str,
    token: str,
    session_id: str,
    read: Read | None,
) -> None:
    """The request from its authentication on (`kind` and `token`: its Authorization's
    scheme and credential). `read`: its body as `serve` read it, if it did, with its call's
    early admission, if any (which the authentication's trip runs when the token, the
    session and the rate pass)."""
    early = read.admission if read is not None else None
    external_id, transport = split_session_id(session_id)
    scheme = "https" if scope.get("scheme") == "https" else "http"
    origin = f"{scheme}://{host}"
    if early is not None:
        audience = origin + "/mcp/"
        agent, known, refusal = await early.start(
            functools.partial(authenticate_and_count, token.strip(), external_id, audience)
        )
    elif kind.lower() == "bearer":
        agent, known, refusal = await db(authenticate_and_count)(
            token.strip(), external_id, origin + "/mcp/"
        )
    else:
        agent, known, refusal = None, None, None
    if agent is None:
        # (a bearer token a holder's leaving voided is told so: one read, on this path only)
        voided = await db(agents.voided_refusal)(token.strip()) if kind.lower() == "bearer" else ""
        return await answer(
            send,
            401,
            "invalid_token",
            voided
            or "Missing, malformed, expired, revoked or unknown token. Sign in with OAuth (the "
            "resource metadata is named in WWW-Authenticate) or send 'Authorization: Bearer "
            "<token>' with a token from `manage.py create_agent`.",
            {"www-authenticate": challenge(origin, sent=bool(token.strip()))},
        )
    if refusal is not None:
        return await answer(
            send, 429, "too_many_requests", str(refusal), {"retry-after": str(refusal.retry_after)}
        )
    method = scope["method"]
    if method not in ("POST", "DELETE"):
        return await answer(
            send,
            405,
            "method_not_allowed",
            "This MCP endpoint answers POST (and DELETE to end a session); it opens no "
            "server-initiated stream.",
            {"allow": "POST, DELETE"},
        )
    body = read.body if read is not None else await read_body(receive)
    if body is None:
        limit = settings.HARNESS_MAX_BODY_BYTES
        return await answer(send, 413, "body_too_large", f"The body is larger than {limit} bytes.")
    try:
        messages = (
            read.messages
            if read is not None and read.messages is not None
            else parse_messages(body, modern=modern(scope))
        )
    except UnnamedRequest as exc:
        return await answer_invalid_request(send, str(exc))
    found = await session_for(agent, session_id, messages, known)
    if not isinstance(found, Joined):
        return await answer(send, *found)
    session = found.session
    if found.header is None:
        transport = secrets.token_hex(8)  # no session: its request ids are its own
    elif found.header != session_id:
        transport = split_session_id(found.header)[1]  # an initialize: the id it is given
    # (else the SDK refuses it; an early read's body is one request, no notification)
    if method == "POST" and early is None and mcp_fast.transport_takes(scope):
        await cancel_requested(agent, session, messages, transport)
    caller = Caller(
        agent=agent,
        session=session,
        base_url=origin,
        loaded=session is known,
        transport=transport,
    )
    # A tools/call that needs nothing of the SDK's server is answered without it.
    known_header = found.header if found.header == session_id and session is known else None
    if early is not None and known_header:  # (read by `early_read`: the fast path's)
        assert read is not None and read.fast is not None
        return await mcp_fast.serve(caller, read.fast, receive, send, known_header, early)
    if (fast := mcp_fast.eligible(scope, messages, known_header)) is not None and known_header:
        return await mcp_fast.serve(caller, fast, receive, send, known_header)
    await run_transport(caller, scope, replay(body, receive), send, session_header=found.header)


# The longest Mcp-Session-Id read together with the token: Harness issues 32 hex digits.
_SESSION_ID_MAX = 200


def authenticate(
    token: str, session_id: str, audience: str = ""
) -> tuple[Agent | None, AgentSession | None]:
    """The agent holding `token` and the agent's MCP session the request names, read in one
    query (with what admission needs: the owner's profile, the session's grants) when
    there is such a session: the path of every call after initialize, as the agent API's
    and the hooks' are. Else the agent alone (None for a bad token) and no session.

    `token` is an agent's bearer token or an OAuth access token (agentauth.tokens: the
    same one read, which also checks that the token was issued for `audience`, this
    endpoint, and has not expired, and that its agent and owner are active).

    The session id is only a key of that read, beside the token that must match it; an id
    Harness could not have issued is not sent with it."""
    oauth = tokens.is_access_token(token)
    if 0 < len(session_id) <= _SESSION_ID_MAX and session_id.isascii() and session_id.isprintable():
        session = (
            tokens.loaded_session(token, CLIENT, session_id, audience)
            if oauth
            else agents.loaded_client_session(token, CLIENT, session_id)
        )
        if session is not None:
            return session.agent, session
    return (tokens.agent_for(token, audience) if oauth else agents.authenticate_token(token)), None


def authenticate_and_count(
    token: str, session_id: str, audience: str = ""
) -> tuple[Agent | None, AgentSession | None, limits.TooManyRequests | None]:
    """`authenticate`, then the request taken from the agent's rate (`limits.take_request`)
    on the same trip to an ORM thread: the refusal, if any, is the third (a thread hop
    fewer per request than a trip of its own)."""
    agent, session = authenticate(token, session_id, audience)
    if agent is None:
        return None, None, None
    try:
        limits.take_request(agent, token)
    except limits.TooManyRequests as refusal:
        return agent, session, refusal
    return agent, session, None


def challenge(origin: str, *, sent: bool) -> str:
    """The 401's WWW-Authenticate: where the protected-resource metadata is (RFC 9728),
    and `invalid_token` when a token was sent (RFC 6750)."""
    metadata = f"{origin}/.well-known/oauth-protected-resource/mcp/"
    error = ', error="invalid_token"' if sent else ""
    return f'Bearer realm="harness", resource_metadata="{metadata}"{error}'


# Harness's Mcp-Session-Id: the Harness session's external id, then (when a run is
# joined by another transport session) "~" and that transport session's own part.
TRANSPORT_MARK = "~"


def split_session_id(session_id: str) -> tuple[str, str]:
    """(the Harness session's external id, the transport session's part or "")."""
    external, mark, transport = session_id.rpartition(TRANSPORT_MARK)
    return (external, transport) if mark else (session_id, "")


@dataclass(frozen=True)
class Joined:
    """The Harness session a request belongs to, and the Mcp-Session-Id its answer
    carries (None: the client keeps no session, none is sent)."""

    session: AgentSession
    header: str | None


async def session_for(
    agent: Agent,
    session_id: str,
    messages: list[types.JSONRPCMessage],
    known: AgentSession | None = None,
) -> Joined | tuple[int, str, str] | tuple[int, str, str, dict[str, str]]:
    """The Harness session of this request (docs/mcp.md, "Which session a request joins"):

    - with an Mcp-Session-Id (not an initialize): the agent's session with that id
      (`known`: `authenticate` read it), else 404;
    - else (an initialize, or a request of a client that keeps no session): the run it
      belongs to, `join_run`: by the run key in its `_meta` (`harness/run`) when it sends
      one, else the agent's latest session of the same client program used within
      HARNESS_MCP_RUN_IDLE seconds, else a new one.

    (status, code, message[, headers]) when there is none: 429 with Retry-After past
    HARNESS_MAX_SESSIONS_PER_MINUTE (nothing started)."""
    initialize = next((m for m in messages if getattr(m, "method", "") == "initialize"), None)
    if session_id and not isinstance(initialize, types.JSONRPCRequest):
        # (`authenticate` read the agent's session with that id, if there is one: the
        # agent and the id are the same keys a second read would use.)
        if known is None:
            return (
                404,
                "unknown_session",
                "Session not found: it belongs to another agent or never existed. "
                "Initialize again.",
            )
        return Joined(known, session_id)
    first = next((m for m in messages if isinstance(m, types.JSONRPCRequest)), None)
    if first is None and not messages:  # (a session's request goes on to the SDK's error)
        return (
            400,
            "unreadable_message",
            "The body is not one JSON-RPC message: it is not JSON, is nested too deeply, is "
            "an array (a batch: no revision since 2025-06-18 has them) or lacks jsonrpc and "
            "method. Send one request, such as initialize.",
        )
    if first is None:
        return (
            400,
            "missing_session",
            "No Mcp-Session-Id header and no request: send an initialize request (or a "
            "request) first.",
        )
    params = first.params if isinstance(first.params, dict) else {}
    try:
        session, started = await db(agents.join_run)(
            agent=agent,
            client=CLIENT,
            title=run_title(params),
            key=run_key(params),
            idle=settings.HARNESS_MCP_RUN_IDLE,
            mode=getattr(agent, "mode_ceiling", None),  # an OAuth agent's chosen profile
        )
    except limits.TooManySessions as refusal:
        return (
            429,
            "too_many_sessions",
            str(refusal),
            {"retry-after": str(refusal.retry_after)},
        )
    if not isinstance(initialize, types.JSONRPCRequest):
        return Joined(session, None)
    if started:
        return Joined(session, session.external_id)
    # Another transport session of a run: its own request ids, the run's session.
    return Joined(session, session.external_id + TRANSPORT_MARK + secrets.token_hex(8))


# Where a client names its run (any request's params._meta): one run, one session.
RUN_KEY = "harness/run"
# Where a client without an initialize (protocol 2026-07-28) names itself.
CLIENT_INFO_META = "io.modelcontextprotocol/clientInfo"


def run_key(params: dict[str, Any]) -> str:
    """The run key the client sent, if it is one Harness can keep (1-190 printable ASCII
    characters); "" otherwise."""
    meta = params.get("_meta")
    key = meta.get(RUN_KEY) if isinstance(meta, dict) else None
    if isinstance(key, str) and 0 < len(key) <= 190 and key.isascii() and key.isprintable():
        return key
    return ""


def run_title(params: dict[str, Any]) -> str:
    """ "MCP: <client name> <version>" from an initialize's clientInfo (or a sessionless
    request's `_meta`): the same client program gets the same title."""
    info = params.get("clientInfo")
    meta = params.get("_meta")
    if not isinstance(info, dict) and isinstance(meta, dict):
        info = meta.get(CLIENT_INFO_META)
    name = ""
    if isinstance(info, dict):
        name = " ".join(str(info.get(k, "")) for k in ("name", "version")).strip()
    # (made storable: a NUL or a lone surrogate in a client's name failed the session's
    # write, a 500 or a 503 "retry later" no retry could pass)
    return storable_copy(f"MCP: {name}"[:200]) if name else "MCP session"


async def cancel_requested(
    agent: Agent, session: AgentSession, messages: list[types.JSONRPCMessage], transport: str
) -> None:
    """`notifications/cancelled` for a tools/call of this session cancels its call if it
    is still pending (a call already running or done is not affected)."""
    for message in messages:
        if not isinstance(message, types.JSONRPCNotification):
            continue
        if message.method != "notifications/cancelled" or not isinstance(message.params, dict):
            continue
        request_id = message.params.get("requestId")
        if not isinstance(request_id, str | int):
            continue
        reason = str(message.params.get("reason") or "")[:500]
        await db(cancel_by_request)(agent, session, request_id, reason, transport)


def cancel_by_request(
    agent: Agent, session: AgentSession, request_id: types.RequestId, reason: str, transport: str
) -> None:
    tool_use_id = mcp_tool_use_id(request_id, transport)
    call = (
        ToolCall.objects.filter(session=session)
        .filter(Q(tool_use_id=tool_use_id) | Q(tool_use_id__startswith=tool_use_id + "/"))
        .first()
    )
    if call is None:
        return
    follow_edits([call])
    transitions.cancel_call(
        call_id=answer_of(call).pk,  # an edited call is cancelled through its replacement
        actor=f"agent:{agent.name}",
        reason=reason or "Cancelled by the MCP client.",
    )


async def run_transport(
    caller: Caller, scope: Scope, receive: Receive, send: Send, *, session_header: str | None
) -> None:
    """The SDK's server for this one request (stateless: the session lives in the
    database, not in this process), in the era the request speaks: a request whose
    MCP-Protocol-Version is not one of the initialize handshake's (2026-07-28, or one the
    SDK then refuses by name) goes to the SDK's per-request entry of the stateless
    revision, as the SDK's own session manager routes it; any other, to the handshake
    era's transport. `session_header`: the Mcp-Session-Id of the transport session (None:
    the client keeps none)."""
    with caller_context(caller):
        if modern(scope):
            await serve_modern(scope, receive, send)
        else:
            await serve_handshake_era(scope, receive, send, session_header)


def protocol_version(scope: Scope) -> str | None:
    """The request's MCP-Protocol-Version header, if it has one."""
    name = MCP_PROTOCOL_VERSION_HEADER.lower().encode("latin-1")
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), None)


def modern(scope: Scope) -> bool:
    """The request names a revision past the initialize handshake (the rule of the SDK's
    `StreamableHTTPSessionManager`: no MCP-Protocol-Version header is the handshake era)."""
    version = protocol_version(scope)
    return version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS


async def serve_modern(scope: Scope, receive: Receive, send: Send) -> None:
    """A 2026-07-28 request: one POST, one answer, no Mcp-Session-Id. Served by the SDK's
    session manager in stateless mode, made for this request (its run() is the task group
    and lifespan the request needs: daphne runs no ASGI lifespan). The SDK checks the
    version, the `_meta` envelope and its headers, and answers server/discover."""
    manager = StreamableHTTPSessionManager(
        app=server,
        stateless=True,
        json_response=False,
        max_request_body_size=settings.HARNESS_MAX_BODY_BYTES,
    )
    async with manager.run():
        await manager.handle_request(scope, receive, send)


async def serve_handshake_era(
    scope: Scope, receive: Receive, send: Send, session_header: str | None
) -> None:
    """A request of the revisions with initialize (2024-11-05 to 2025-11-25): the SDK's
    Streamable HTTP transport, answering with Harness's Mcp-Session-Id, and a connection
    born initialized (as the SDK's stateless manager makes it), so a request after
    initialize is served by whichever process receives it."""
    transport = StreamableHTTPServerTransport(
        mcp_session_id=session_header, is_json_response_enabled=False
    )
    # (without the header, the version the specification says to assume)
    version = protocol_version(scope) or types.DEFAULT_NEGOTIATED_VERSION
    async with anyio.create_task_group() as group:

        async def run_server(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            async with transport.connect() as (read_stream, write_stream):
                task_status.started()
                dispatcher: JSONRPCDispatcher[TransportContext] = JSONRPCDispatcher(
                    read_stream,
                    write_stream,
                    inline_methods=frozenset({"initialize"}),
                    # (no server-to-client requests: their answers would reach
                    # another process)
                    transport_builder=lambda _: TransportContext(
                        kind="streamable-http", can_send_request=False
                    ),
                )
                await serve_connection(
                    server,
                    dispatcher,
                    connection=Connection.from_envelope(version, None, None),
                    lifespan_state={},
                    init_options=initialization_options(),
                )

        await group.start(run_server)
        try:
            await transport.handle_request(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await transport.terminate()


@functools.cache
def initialization_options() -> InitializationOptions:
    """What the server answers to initialize, the same for every request: built once per
    process."""
    return server.create_initialization_options()


def parse_messages(body: bytes, *, modern: bool = False) -> list[types.JSONRPCMessage]:
    """The JSON-RPC message of a POST body, read as the SDK's transport reads it
    (`pydantic_core.from_json`, then its message types by alias; a 2026-07-28 request's
    entry, `modern`, reads it with `json.loads`, which also takes a BOM, UTF-16, a lone
    surrogate and deeper nesting), so what Harness reads
    here (a cancellation, the fast path's call) is what the SDK would: [] if it cannot be
    read (the transport then answers the error itself). An array is not read: the
    protocol has no batches since 2025-06-18 and the SDK refuses them, and reading one
    message by message would let one request (one from the agent's rate) do the work of
    thousands (a cancellation each)."""
    try:
        read = json.loads if modern else pydantic_core.from_json
        data = read(body) if body.strip() else None
    except (ValueError, RecursionError):
        return []
    if data is None or isinstance(data, list):
        return []
    with contextlib.suppress(pydantic.ValidationError):
        message = types.jsonrpc_message_adapter.validate_python(data, by_name=False)
        if (
            isinstance(message, types.JSONRPCNotification)
            and "id" in data
            and not message.method.startswith("notifications/")
        ):
            # The SDK reads a request whose id is not a string or an integer (null, 1.5,
            # true) as a notification: answered 202 and never run, its client waiting
            # for an answer that never comes. (A notification sent with an id is still
            # read as one.)
            raise UnnamedRequest(
                f"The request's id is {json.dumps(data['id'])[:100]}; a request's id must "
                "be a string or an integer (MCP), and a notification has none. Nothing "
                "was run."
            )
        return [message]
    return []


class UnnamedRequest(ValueError):
    """A request with an id the protocol does not allow: it can be answered by none."""


async def answer_invalid_request(send: Send, message: str) -> None:
    """400 with the JSON-RPC error Invalid Request (id null: the request's own id is not one
    to answer), as the SDK's transport answers a body it cannot read."""
    error = types.JSONRPCError(
        jsonrpc="2.0", id=None, error=types.ErrorData(code=types.INVALID_REQUEST, message=message)
    )
    body = error.model_dump_json(by_alias=True, exclude_unset=True).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when it is larger than HARNESS_MAX_BODY_BYTES."""
    limit = settings.HARNESS_MAX_BODY_BYTES
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the transport the body already read, then the real events
    (the client's disconnect)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def answer(
    send: Send, status: int, code: str, message: str, extra: dict[str, str] | None = None
) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
