"""The MCP gateway's fast path (issue 37; docs/mcp.md, "The fast path"): a `tools/call`
that needs nothing of the SDK's per-request server is answered here, without building
the SDK's transport, dispatcher and runner for it (most of the gateway's CPU per call:
docs/benchmarks.md, S14).

A request is served here only when all of this holds; anything else goes to the SDK
(`mcp_http.run_transport`) unchanged, so the SDK still answers every error of its own:

- a POST of a known session (its Mcp-Session-Id read by `mcp_http.authenticate`), not
  an initialize;
- an MCP-Protocol-Version header naming one of the initialize handshake's revisions (the
  2026-07-28 revision, or no header, goes to the SDK);
- the headers the SDK's transport requires: Content-Type application/json (both of its
  checks), an Accept of application/json and text/event-stream;
- a body that is one JSON-RPC request (the SDK's own parse: `mcp_http.parse_messages`), method `tools/call`, params
  valid for that revision and for `CallToolRequestParams`, and no progress token
  (progress notifications need the SDK's stream).

The call is answered by the handler the SDK's server calls (`mcp.answer_call`, in the
same Caller context) with the JSON-RPC response the SDK's runner and dispatcher make of
the handler's result or exception, framed as the SDK's transport frames an answer in one
of its two modes. A call answered within JSON_WITHIN seconds (an allowed or refused call,
a reviewer's quick decision) gets it as one `application/json` body, as the transport's
JSON mode writes it: the protocol lets a server answer a request either way and requires
a client to take both, and the official client reads a JSON body to its end and keeps
its connection for the next call, where it drops the connection after an SSE answer's
message (a new connection for every call: docs/benchmarks.md, S14L). A call still waiting
then (for a reviewer) gets the SSE stream from then on, as the transport's SSE mode
writes it: its headers, keep-alive pings as often as sse_starlette's, and one `message`
event. Either way, a client that goes away cancels the request as it does there.
Harness's handler sends nothing to the client mid-call without a progress token (no
logging, sampling or elicitation), so the one message is the whole answer.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import pydantic
import pydantic_core
from django.conf import settings
from mcp import types
from mcp.server.connection import Connection
from mcp.server.runner import ServerRunner
from mcp.server.streamable_http import CONTENT_TYPE_JSON, check_accept_headers
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data
from mcp.types.version import HANDSHAKE_PROTOCOL_VERSIONS
from mcp_types import methods
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from dispatcher.gateways.mcp import (
    Caller,
    EarlyAdmission,
    Progress,
    answer_call,
    caller_context,
    server,
)

logger = logging.getLogger(__name__)

METHOD = "tools/call"
# How long a call may take and still be answered as one JSON body; one still waiting then
# gets the SSE stream, whose first ping comes when the SDK's stream sends its first (a ping
# interval after the request began).
JSON_WITHIN = 1.0


@dataclass(frozen=True)
class FastCall:
    """An eligible request: its id, its params as the SDK's handler receives them, and
    the revision it speaks."""

    request_id: types.RequestId
    params: types.CallToolRequestParams
    version: str


def eligible(
    scope: Scope, messages: list[types.JSONRPCMessage], session_header: str | None
) -> FastCall | None:
    """The request, when the fast path may answer it (the module's list); else None.
    `messages`: its body as the SDK's transport reads it (`mcp_http.parse_messages`).
    `session_header`: the Mcp-Session-Id of the known session the request named (None
    for anything else: an initialize, a client keeping no session)."""
    version = eligible_version(scope, session_header)
    return None if version is None else parse(messages, version)


def eligible_version(scope: Scope, session_header: str | None) -> str | None:
    """The revision the request names, when the fast path may take a request with its
    method and headers (the module's list, less its body); else None."""
    if not settings.HARNESS_MCP_FAST_PATH or scope["method"] != "POST" or not session_header:
        return None
    headers = Headers(scope=scope)
    if headers.get("mcp-session-id") != session_header:
        return None
    version = headers.get(MCP_PROTOCOL_VERSION_HEADER)
    if version is None or not _transport_takes(headers):  # (no header: the SDK's)
        return None
    return version


def transport_takes(scope: Scope) -> bool:
    """The handshake era's transport would take a POST of this request (its Accept and
    Content-Type as it requires them; the version it is routed by, one of that era's or
    none): what Harness reads of its body before the SDK (a cancellation) is then read by
    the SDK too. A 2026-07-28 request's entry drops the notifications posted to it."""
    return _transport_takes(Headers(scope=scope))


def _transport_takes(headers: Headers) -> bool:
    version = headers.get(MCP_PROTOCOL_VERSION_HEADER)
    if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return False
    has_json, has_sse = check_accept_headers(_HeadersOnly(headers))  # type: ignore[arg-type]
    return has_json and has_sse and _content_type_json(headers)


class _HeadersOnly:
    """What `check_accept_headers` reads of a request."""

    def __init__(self, headers: Headers) -> None:
        self.headers = headers


def _content_type_json(headers: Headers) -> bool:
    """Both of the SDK's Content-Type checks (its transport security's, its transport's)."""
    content_type = headers.get("content-type")
    if content_type is None or not content_type.lower().startswith(CONTENT_TYPE_JSON):
        return False
    parts = [part.strip() for part in content_type.split(";")[0].split(",")]
    return CONTENT_TYPE_JSON in parts


def parse(messages: list[types.JSONRPCMessage], version: str) -> FastCall | None:
    """The request, when its body is one tools/call request whose params the handler
    would receive as they are (`version`: the revision `eligible_version` found)."""
    message = messages[0] if len(messages) == 1 else None
    if not isinstance(message, types.JSONRPCRequest) or message.method != METHOD:
        return None
    params = message.params
    if not isinstance(params, dict):
        return None
    meta = params.get("_meta")
    if meta is not None and (not isinstance(meta, dict) or "progressToken" in meta):
        return None  # progress goes on the SDK's stream
    try:
        methods.validate_client_request(METHOD, version, params)
        typed = types.CallToolRequestParams.model_validate(params, by_name=False)
    except (KeyError, ValueError, pydantic.ValidationError):
        return None  # the SDK answers its own error
    return FastCall(message.id, typed, version)


async def serve(
    caller: Caller,
    request: FastCall,
    receive: Receive,
    send: Send,
    session_header: str,
    early: EarlyAdmission | None = None,
) -> None:
    """Answer `request` as the SDK's transport would: as one JSON body when it is done
    within JSON_WITHIN seconds, else on the SSE stream opened then (pinging while the call
    waits) as one event; nothing more when the client goes away first. `early`: its call,
    admitted on the request's authentication's trip (mcp_http.early_read)."""
    answer = _Answer(send, session_header)
    message: str | None = None
    # (a plain task watches the client, lighter than a task group; the request is
    # cancelled through an anyio scope, which keeps the handler's shielded admission)
    with caller_context(caller), anyio.CancelScope() as hung_up:
        watcher = asyncio.ensure_future(_keep_alive(receive, answer, hung_up))
        try:
            message = await _message(caller, request, early)
        finally:
            answer.settled = True  # (no stream opened, no ping sent from now on)
            watcher.cancel()
    if message is not None:
        await answer.write(message)


class _Answer:
    """The response's framing, decided once: one JSON body unless the watcher opened the
    SSE stream first (`open`, after JSON_WITHIN seconds), one event on it then. Nothing
    is opened or pinged once the call's message is in (`settled`), and the answer is
    written after the watcher's last send has gone out, even if the watcher was
    cancelled during it."""

    def __init__(self, send: Send, session_header: str) -> None:
        self.send, self.session_header = send, session_header
        self.streaming = False
        self.settled = False
        self.pending: asyncio.Future[None] | None = None

    async def open(self) -> bool:
        """The SSE stream's headers sent, unless the answer is in (False then)."""
        if self.settled:
            return False
        self.streaming = True
        headers = sse_headers(self.session_header)
        await self._sent({"type": "http.response.start", "status": 200, "headers": headers})
        return True

    async def ping(self, body: bytes) -> bool:
        if self.settled:
            return False
        await self._sent({"type": "http.response.body", "body": body, "more_body": True})
        return True

    async def _sent(self, message: dict[str, Any]) -> None:
        self.pending = asyncio.ensure_future(self.send(message))
        await asyncio.shield(self.pending)

    async def write(self, message: str) -> None:
        """The JSON-RPC response: one SSE event on an open stream, else one JSON body."""
        if self.pending is not None:
            await asyncio.wait({self.pending})  # (its failure is the connection's: so be it)
        if self.streaming:
            sep = EventSourceResponse.DEFAULT_SEPARATOR
            event = ServerSentEvent(data=message, event="message", sep=sep).encode()
            await self.send({"type": "http.response.body", "body": event, "more_body": True})
            await self.send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        body = message.encode()
        headers = json_headers(self.session_header, len(body))
        await self.send({"type": "http.response.start", "status": 200, "headers": headers})
        await self.send({"type": "http.response.body", "body": body, "more_body": False})


async def _message(caller: Caller, request: FastCall, early: EarlyAdmission | None) -> str:
    """The JSON-RPC response: the handler's result shaped by the SDK's runner, or its
    exception mapped as the SDK's dispatcher maps it."""
    try:
        result = await answer_call(
            request.request_id,
            request.params,
            Progress(caller, protocol_version=request.version),
            early,
        )
        shaped = _runner(request.version)._serialize(METHOD, request.version, result)
    except Exception as exc:
        error = handler_exception_to_error_data(exc)
        if error is None:
            logger.exception("handler for %r raised", METHOD)
            error = types.ErrorData(code=0, message=str(exc))  # (the SDK's dispatcher's)
        message = types.JSONRPCError(jsonrpc="2.0", id=request.request_id, error=error)
        return message.model_dump_json(by_alias=True, exclude_unset=True)
    return response_json(request.request_id, shaped)


def response_json(request_id: types.RequestId, result: dict[str, Any]) -> str:
    """`types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result)` as its
    `model_dump_json(by_alias=True, exclude_unset=True)` writes it (the same bytes:
    pydantic's own JSON writer, its three fields in their order), without building and
    validating the model around a result the SDK's runner has just shaped and a request
    id the SDK's parse has just read."""
    return pydantic_core.to_json({"jsonrpc": "2.0", "id": request_id, "result": result}).decode()


@functools.cache
def _runner(version: str) -> ServerRunner[Any]:
    """The SDK's runner for `version`, used only for its shaping of a result
    (`_serialize`: cache hints, the revision's result sieve): the same wire form."""
    return ServerRunner(server, Connection.from_envelope(version, None, None), {})


async def _keep_alive(receive: Receive, answer: _Answer, scope: anyio.CancelScope) -> None:
    """After JSON_WITHIN seconds, the SSE stream opened; then sse_starlette's ping comment
    every DEFAULT_PING_INTERVAL seconds from the request's start while the call waits
    (the first when the SDK's stream sends its first: daphne writes the headers with the
    first body, so the wire is never silent longer than on the SDK's stream); the request
    cancelled (`scope`) when the client disconnects."""
    interval = EventSourceResponse.DEFAULT_PING_INTERVAL
    wait = JSON_WITHIN
    while True:
        with anyio.move_on_after(wait):
            while (await receive())["type"] != "http.disconnect":
                pass
            scope.cancel()
            return
        try:
            if not answer.streaming:
                if not await answer.open():
                    return
                wait = max(0.0, interval - JSON_WITHIN)
                continue
            wait = interval
            sep = EventSourceResponse.DEFAULT_SEPARATOR
            ping = ServerSentEvent(comment=f"ping - {datetime.now(UTC)}", sep=sep)
            if not await answer.ping(ping.encode()):
                return
        except OSError:  # the connection is gone: so is the client
            scope.cancel()
            return


@functools.cache
def _base_headers() -> tuple[tuple[bytes, bytes], ...]:
    """The SDK transport's SSE response headers, without the session's."""
    sdk = {
        "Cache-Control": "no-cache, no-transform",
        "Connection": "keep-alive",
        "Content-Type": "text/event-stream",
    }
    return tuple(EventSourceResponse(content=iter(()), headers=sdk).raw_headers)


def json_headers(session_header: str, length: int) -> list[tuple[bytes, bytes]]:
    """The SDK transport's headers for an answer in its JSON mode (a starlette Response
    with its Content-Type and the session's header)."""
    return [
        (b"content-type", CONTENT_TYPE_JSON.encode()),
        (b"mcp-session-id", session_header.encode("latin-1")),
        (b"content-length", str(length).encode()),
    ]


def sse_headers(session_header: str) -> list[tuple[bytes, bytes]]:
    base = list(_base_headers())
    return [*base[:3], (b"mcp-session-id", session_header.encode("latin-1")), *base[3:]]
