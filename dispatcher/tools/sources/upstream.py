"""Talking to upstream MCP servers with the official `mcp` client.

`list_definitions` opens a session once (registration, refresh). Workers call tools
through `POOL`: one event loop thread per process and one open session per server (and
configuration version), kept across calls; a stdio server that died is started again on
the next call; a session whose call timed out or lost its connection is closed. A call
run inline by a web request of an HTTP server is made on that request's own event loop,
with a session kept there (`Pool.loop_for`).

stdio servers start through `launch_argv`: a scrubbed environment (only the variables
configured for the server, plus PATH), applied inside the sandbox after the drop to the
sandbox user, and `sandboxed_argv`, the one place their command is put in the sandbox.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from itertools import count
from pathlib import Path
from typing import Any, TextIO

import anyio
import httpx2
import pydantic
from django.conf import settings
from httpx2._models import _is_known_encoding, _parse_content_type_charset
from httpx2._sse import _SSEParser
from httpx2._urls import host_header
from mcp import ClientSession, StdioServerParameters, types
from mcp.client import session as sdk_session
from mcp.client.extension import UnexpectedClaimedResult
from mcp.client.stdio import DEFAULT_INHERITED_ENV_VARS
from mcp.client.streamable_http import (
    MCP_SESSION_ID,
    RequestContext,
    StreamableHTTPTransport,
    _unfollowed_redirect,
)
from mcp.shared import jsonrpc_dispatcher
from mcp.shared._context_streams import create_context_streams
from mcp.shared._httpx_utils import next_request_within_origin
from mcp.shared._otel import inject_trace_context
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, MCP_PROTOCOL_VERSION_HEADER, encode_header_value
from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params
from mcp.shared.message import ClientMessageMetadata, SessionMessage
from mcp_types import methods as sdk_methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from dispatcher.tools import base, sandbox, sandbox_servers
from dispatcher.tools._paths import cap_text
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.sources.definitions import Definition
from dispatcher.tools.sources.models import McpServer
from dispatcher.tools.sources.stdio import bounded_stdio_client
from floor import outbound

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 30.0
MAX_PAGES = 100
# The largest answer an HTTP server may send to one request (a tool result, a page of
# tools), and the longest message a stdio server may send (one line,
# stdio.bounded_stdio_client); more is refused as it arrives rather than held whole in
# the worker.
ANSWER_BYTES = 32 << 20
# The calls one process has in flight on one HTTP server's session at once (each its own
# POST, as the MCP client sends them); a call past them waits its turn, and is not sent
# once its timeout has passed. Under the door's HTTP connections per client
# (floor.outbound.ASYNC_CONNECTIONS), one of which is the session's GET stream, so no
# request ever waits inside the HTTP client, where its deadline is not checked. A stdio
# server gets one call at a time: a call that times out stops its process.
HTTP_IN_FLIGHT = 64


@dataclass(frozen=True)
class Endpoint:
    """A server's configuration as one process uses it (an immutable copy of the row)."""

    server_id: int
    version: int
    name: str
    transport: str
    command: tuple[str, ...] = ()
    # (secrets, never in a repr: an exception's text may quote the configuration)
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    url: str = field(default="", repr=False)  # (a key may be in its path or query)
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    paths: tuple[str, ...] = ()
    timeout: float = 60.0

    @property
    def key(self) -> Endpoint:
        """What a pooled session is kept under: the whole configuration (an id alone may be
        used again after a removal, on SQLite)."""
        return self


def endpoint_of(server: McpServer) -> Endpoint:
    return Endpoint(
        server_id=server.pk,
        version=server.version,
        name=server.name,
        transport=server.transport,
        command=tuple(server.command),
        env=tuple(sorted(server.env.items())),
        url=server.url,
        headers=tuple(sorted(server.headers.items())),
        paths=tuple(server.paths),
        timeout=server.timeout,
    )


class UpstreamError(Exception):
    """The server could not be reached or answered with a protocol error."""


class DefinitionChanged(Exception):
    """The server lists the tool with another definition than its pin (`definition`), or
    not at all (None): the call is not made."""

    def __init__(self, definition: Definition | None) -> None:
        super().__init__(definition.name if definition else "missing")
        self.definition = definition


# --- Launching stdio servers -------------------------------------------------------------


def sandboxed_argv(
    argv: list[str], paths: list[str], held: contextlib.ExitStack, environment: dict[str, str]
) -> list[str]:
    """`argv` wrapped in the sandbox, with `paths` the server may use and `environment` as
    its whole environment: the one place an upstream stdio server is put in the sandbox
    (`sandbox_servers.sandboxed_argv`, bubblewrap; `held` keeps the descriptors of the
    paths and of the environment open until the server has started). Raises ToolError
    (SandboxUnavailable among them): then nothing is started."""
    return sandbox_servers.sandboxed_argv(argv, paths, held, environment)


def launch_argv(endpoint: Endpoint, held: contextlib.ExitStack) -> tuple[list[str], dict[str, str]]:
    """The argv and environment to start a stdio server with. The server's environment is
    only its configured variables plus PATH; with the sandbox on it is applied inside the
    sandbox, after the drop to the sandbox user, and the launcher itself starts with
    sandbox_servers.LAUNCHER_ENVIRONMENT (the launcher runs as Harness, root often: a
    configured LD_PRELOAD was loaded into it). With the sandbox off the server is started
    with it directly (stdio.bounded_stdio_client adds none of the SDK's defaults; `env -u`
    takes HOME, USER, ... out again all the same, unless they were configured). The program is looked up on that PATH here, so that the sandbox
    can show it the files it needs to start."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **dict(endpoint.env)}
    problem = sandbox_servers.environment_problem(dict(endpoint.env))
    if problem is not None:  # (registered before it was refused: never started)
        raise ToolError(f"{problem} The server was not started; an admin must fix it.")
    program, *args = endpoint.command
    if "/" not in program:
        program = shutil.which(program, path=env["PATH"]) or program
    if sandbox.mode() != "off":
        launcher = dict(sandbox_servers.LAUNCHER_ENVIRONMENT)
        return sandboxed_argv([program, *args], list(endpoint.paths), held, env), launcher
    unset = [name for name in DEFAULT_INHERITED_ENV_VARS if name not in env]
    tool = shutil.which("env") or "/usr/bin/env"
    scrub = [tool, *[arg for name in unset for arg in ("-u", name)], "--"]
    return [*scrub, program, *args], env


START_FAILURE_LINES = 12
# What of the log a start's failure reads: its end. A server that wrote its whole file
# size limit (1 GiB) to stderr and exited had the worker read all of it, then split it
# into lines (gigabytes of line objects for a gigabyte of newlines).
START_FAILURE_BYTES = 64 << 10


def start_failure(exc: BaseException, log: Path, start: int) -> str:
    """What registration and a call say when a stdio server did not start: the error,
    the exit status the sandbox's launcher wrote, and the last lines the server wrote to
    stderr (read back from its log, from where this start began)."""
    try:
        with log.open("rb") as lines:
            end = lines.seek(0, os.SEEK_END)
            cut = end - START_FAILURE_BYTES > start
            lines.seek(max(start, end - START_FAILURE_BYTES))
            written = lines.read(START_FAILURE_BYTES).decode("utf-8", errors="replace").splitlines()
            written = written[1:] if cut else written  # (the first line may be a part)
    except OSError:
        written = []
    status, written = _exit_report(written)
    written = [line for line in written if line.strip()]
    message = f"The server did not start: {describe(exc)}."
    if status is not None:
        message += f" It exited with status {status}."
    if written:
        tail = "\n".join(f"  {line}" for line in written[-START_FAILURE_LINES:])
        hint = "an admin can read the whole log in the data directory's mcp-servers/"
        message += f" The last lines it wrote to stderr:\n{cap_text(tail, 4000, hint)}"
    else:
        message += " It wrote nothing to stderr."
    return message


def _exit_report(written: list[str]) -> tuple[str | None, list[str]]:
    """The status the launcher reported and the server's own lines. The launcher writes
    its report after the last line it copied, so only the last line is its: the server
    writes to the same log, and a line of its own that said the same (any line that began
    so was taken for the report, the last of them read as the status) faked an exit status
    when it never exited, and was dropped from the lines shown. A last line the server
    left without a newline runs into the report: that part is the server's."""
    last = (
        re.fullmatch(rf"(.*){re.escape(sandbox.EXIT_REPORT)} (\d+)", written[-1])
        if written
        else None
    )
    if last is None:
        return None, written
    return last.group(2), [*written[:-1], last.group(1)]


def _stderr_log(endpoint: Endpoint) -> TextIO:
    """The server's stderr: its log in the data directory, readable by Harness alone. The
    server holds it as descriptor 2 and could open it again through /proc/self/fd/2 as
    whatever uid the file's mode lets read it: mode 0644 let a server read the whole log,
    what earlier servers of its name (another team's, removed since) wrote included."""
    folder = Path(settings.DATA_DIR) / "mcp-servers"
    folder.mkdir(parents=True, exist_ok=True)
    log = open(  # noqa: PTH123, SIM115 - Path.open takes no opener; the caller closes it
        folder / f"{endpoint.name}.stderr.log",
        "a",
        encoding="utf-8",
        opener=lambda path, flags: os.open(path, flags | os.O_NOFOLLOW, 0o600),
    )
    try:
        os.fchmod(log.fileno(), 0o600)  # (a log made before)
    except BaseException:
        log.close()
        raise
    return log


@asynccontextmanager
async def open_session(
    endpoint: Endpoint,
    forgotten: Callable[[], None] | None = None,
    too_large: Callable[[], None] | None = None,
    opened: Callable[[_Transport], None] | None = None,
) -> AsyncIterator[ClientSession]:
    """An initialized client session with the server (stdio: the process runs while it
    is open); `forgotten` is called when an HTTP server answers a request of the session
    404, the session unknown to it (a server restarted, or one that ended it);
    `too_large` when a stdio server sends a message past ANSWER_BYTES, which ends the
    session (an HTTP server's answer past it fails its request alone: the door's cap);
    `opened` is given an HTTP session's transport, once initialized (`lean_call`)."""
    if endpoint.transport == "stdio":
        # (the writable paths' descriptors stay open while the server runs: its launcher
        # opens them again from this process when it starts)
        with contextlib.ExitStack() as held, _stderr_log(endpoint) as errlog:
            argv, env = launch_argv(endpoint, held)
            params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
            start = errlog.tell()
            started = False
            try:
                async with (
                    bounded_stdio_client(
                        params, errlog, ANSWER_BYTES, too_large or (lambda: None)
                    ) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    started = True
                    yield session
            except Exception as exc:
                if started:
                    raise
                raise ToolError(start_failure(exc, Path(errlog.name), start)) from exc
        return

    async def answered(response: httpx2.Response) -> None:
        session_id = response.request.headers.get("mcp-session-id")
        if response.status_code == 404 and session_id and forgotten is not None:
            forgotten()  # (a lean call's answer: _Transport._lean_post, the same test)

    # Through the outbound door: the address policy, no redirects (floor.outbound).
    http = outbound.async_client(
        limit=ANSWER_BYTES,
        headers=dict(endpoint.headers),
        timeout=httpx2.Timeout(CONNECT_TIMEOUT, read=endpoint.timeout + 5),
        event_hooks={"response": [answered]},
    )
    async with (
        http,
        _http_streams(endpoint.url, http) as (read, write, transport),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        transport.forgotten = forgotten
        if opened is not None:
            opened(transport)
        yield session


class _Transport(StreamableHTTPTransport):
    """The SDK's streamable-HTTP client transport, but one request's POST fails alone:
    its connection cut, its answer too large (the door's cap) or timed out, the request is
    answered "connection closed" (its caller: not known whether it took effect) and the
    other calls in flight on the session go on; the SDK's own lets the failure end the
    session's task group, cutting every call in flight on it, those of other agents (a
    failed notification is dropped). And a request whose caller has given up on it (timed
    out, or cancelled) has its POST ended with the notice that cancels it, as the SDK does
    at the 2026 protocol only: at the older ones it kept its connection until the server
    answered, so that calls given up on piled up past HTTP_IN_FLIGHT, and past the
    client's connections a new call's request waited inside the HTTP client, to be sent
    once one was freed, after its agent had been told it timed out."""

    # What `lean_call` sends through: the session's HTTP client and the stream its
    # messages are read from (set when the sender starts); and the notifications the
    # sender is POSTing now (it sends one at a time, holding every later message).
    client: httpx2.AsyncClient | None = None
    incoming: Any = None
    notices = 0
    # (`open_session`'s `forgotten`, which its client's response hook calls; a lean call's
    # answer does not pass that hook)
    forgotten: Callable[[], None] | None = None
    # (the endpoint's URL carries credentials, which httpx2's client sends with each
    # request as Basic auth, and `_Sent` does not: `lean_ready`)
    credentialed = False

    async def post_writer(self, client: httpx2.AsyncClient, *args: Any, **kwargs: Any) -> None:
        self.client, self.incoming = client, args[1]  # (read_stream_writer)
        self.credentialed = bool(httpx2.URL(self.url).userinfo)
        await super().post_writer(client, *args, **kwargs)

    async def _handle_post_request(self, ctx: RequestContext) -> None:
        await self._post(ctx, super()._handle_post_request)

    async def lean_post(self, ctx: RequestContext) -> None:
        """A lean call's POST (`_lean_post`), failing alone as any request's does."""
        await self._post(ctx, self._lean_post)

    async def _post(
        self, ctx: RequestContext, send: Callable[[RequestContext], Awaitable[None]]
    ) -> None:
        notice = not isinstance(ctx.session_message.message, types.JSONRPCRequest)
        self.notices += notice
        try:
            await send(ctx)
        except Exception as exc:  # noqa: BLE001 - this request's failure, not the session's
            message = ctx.session_message.message
            if isinstance(message, types.JSONRPCRequest):
                await self._resolve_abandoned_request(
                    ctx.read_stream_writer, message.id, describe(exc)
                )
            else:
                logger.info("an MCP notification was not delivered: %s", describe(exc))
        finally:
            self.notices -= notice

    async def _lean_post(self, ctx: RequestContext) -> None:
        """The SDK's `_handle_post_request` for a request (a lean call's), its POST sent and
        its answer read by httpcore2 on the client's pool (`outbound.exchange`: the same
        door, connections, cap and timeouts) instead of through httpx2's client and its
        request and response objects; each answer ends as it does there, branch for branch:
        202, a redirect (followed within the endpoint's origin, else refused), an error
        status (a JSON-RPC error in its body, 404), a JSON answer, an SSE answer (its events
        handed to the SDK's own handling, its reconnection the SDK's own), another type."""
        message = ctx.session_message.message
        assert isinstance(message, types.JSONRPCRequest) and ctx.client is not None
        headers = self._prepare_headers()
        if ctx.metadata is not None and ctx.metadata.headers is not None:
            headers.update(ctx.metadata.headers)
        sent = _Sent(ctx.client, httpx2.URL(self.url), headers, message)
        redirect: httpx2.Response | None = None
        for followed in count():
            async with outbound.exchange(
                ctx.client, "POST", sent.url, sent.headers, sent.content
            ) as answer:
                self._answered(ctx.client, sent, answer)
                redirect = _redirect(ctx.client, sent, answer)
                following = redirect is not None and next_request_within_origin(redirect)
                if following and followed < ctx.client.max_redirects:
                    await answer.read()  # (as the SDK drains a redirect it follows)
                    sent = sent.to(following)
                    continue
                await self._lean_answer(ctx, message, answer, redirect)
                return

    def _answered(self, client: httpx2.AsyncClient, sent: _Sent, answer: outbound.Opened) -> None:
        """What the client does with every answer through httpx2's client: its cookies kept
        (a session that gets one is sent the SDK's way from then on: `lean_ready`), and a
        404 to a request of the session reported (`open_session`'s `answered` hook)."""
        if "set-cookie" in answer.headers:
            client.cookies.extract_cookies(sent.response(answer))
        if answer.status == 404 and sent.session_id and self.forgotten is not None:
            self.forgotten()

    async def _lean_answer(
        self,
        ctx: RequestContext,
        message: types.JSONRPCRequest,
        answer: outbound.Opened,
        redirect: httpx2.Response | None,
    ) -> None:
        """The answer to a request handled as `_handle_post_request` handles it."""
        writer = ctx.read_stream_writer
        if answer.status == 202:
            await self._resolve_abandoned_request(
                writer,
                message.id,
                "server answered a request with 202 Accepted",
                code=types.INVALID_REQUEST,
            )
            return
        if redirect is not None and (refused := _unfollowed_redirect(redirect)) is not None:
            logger.warning(refused)
            await self._resolve_abandoned_request(
                writer, message.id, refused, code=types.INVALID_REQUEST
            )
            return
        content_type = answer.headers.get("content-type", "").lower()
        if answer.status >= 400:
            if content_type.startswith("application/json"):
                with contextlib.suppress(httpx2.StreamError, pydantic.ValidationError):
                    parsed = types.jsonrpc_message_adapter.validate_json(
                        await answer.read(), by_name=False
                    )
                    if isinstance(parsed, types.JSONRPCError):
                        rejected = types.JSONRPCError(
                            jsonrpc="2.0", id=message.id, error=parsed.error
                        )
                        await writer.send(SessionMessage(rejected))
                        return
            if answer.status == 404 and self.session_id is None:
                error = types.ErrorData(code=types.METHOD_NOT_FOUND, message="Not Found")
            elif answer.status == 404:
                error = types.ErrorData(code=types.INVALID_REQUEST, message="Session terminated")
            else:
                error = types.ErrorData(
                    code=types.INTERNAL_ERROR, message="Server returned an error response"
                )
            await writer.send(
                SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=message.id, error=error))
            )
            return
        if content_type.startswith("application/json"):
            reply: types.JSONRPCMessage
            try:
                reply = types.jsonrpc_message_adapter.validate_json(
                    await answer.read(), by_name=False
                )
            except (httpx2.StreamError, pydantic.ValidationError) as exc:
                error = types.ErrorData(
                    code=types.PARSE_ERROR, message=f"Failed to parse JSON response: {exc}"
                )
                reply = types.JSONRPCError(jsonrpc="2.0", id=message.id, error=error)
            await writer.send(SessionMessage(reply))
        elif content_type.startswith("text/event-stream"):
            await self._lean_sse(ctx, message, answer)
        else:
            error = types.ErrorData(
                code=types.INVALID_REQUEST, message=f"Unexpected content type: {content_type}"
            )
            await writer.send(
                SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=message.id, error=error))
            )

    async def _lean_sse(
        self, ctx: RequestContext, message: types.JSONRPCRequest, answer: outbound.Opened
    ) -> None:
        """`_handle_sse_response` on the answer's events (`_events`)."""
        last_event_id: str | None = None
        retry_ms: int | None = None
        resumed = ctx.metadata.on_resumption_token_update if ctx.metadata else None
        try:
            async for sse in _events(answer, self.max_sse_event_size):
                last_event_id = sse.id or last_event_id
                retry_ms = retry_ms if sse.retry is None else sse.retry
                if await self._handle_sse_event(
                    sse, ctx.read_stream_writer, original_request_id=message.id,
                    resumption_callback=resumed,
                ):  # fmt: skip
                    return
        except httpx2.SSEError as exc:
            await self._resolve_abandoned_request(
                ctx.read_stream_writer, message.id, f"SSE stream failed: {exc}"
            )
            return
        except Exception:  # noqa: BLE001 - the SDK's way: an answer cut is one that ended
            logger.debug("SSE stream ended", exc_info=True)
        if last_event_id is not None:
            await self._handle_reconnection(ctx, last_event_id, retry_ms)
        else:
            await self._resolve_abandoned_request(
                ctx.read_stream_writer, message.id, "SSE stream ended without a response"
            )

    def _consume_modern_cancellation(self, session_message: SessionMessage) -> bool:
        message = session_message.message
        if isinstance(message, types.JSONRPCNotification) and (
            message.method == "notifications/cancelled"
        ):
            request_id = cancelled_request_id_from_params(message.params)
            post = self._in_flight_posts.get(request_id) if request_id is not None else None
            if post is not None and not post.modern:
                post.scope.cancel()  # (the notice itself is still sent, below)
        return super()._consume_modern_cancellation(session_message)


class _Sent:
    """A lean call's POST as httpx2's client would send it: the client's headers, those of
    the request in their place (compared without case), Host and Content-Length; its body
    the message as httpx2 encodes `json=`."""

    def __init__(
        self,
        client: httpx2.AsyncClient,
        url: httpx2.URL,
        headers: dict[str, str],
        message: types.JSONRPCRequest,
    ) -> None:
        dumped = message.model_dump(by_alias=True, mode="json", exclude_unset=True)
        self.content = json.dumps(
            dumped, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode()
        own = [(key.encode("ascii"), value.encode("ascii")) for key, value in headers.items()]
        names = {key.lower() for key, _ in own}
        kept = [(key, value) for key, value in client.headers.raw if key.lower() not in names]
        # (Host and Content-Length only when neither the request's headers nor the
        # client's, an admin's configured headers among them, name one: two Host headers
        # h11 refuses to send, and httpx2 sends the configured one)
        names |= {key.lower() for key, _ in kept}
        host = [] if b"host" in names else [(b"Host", host_header(url))]
        size = (
            [] if b"content-length" in names else [(b"Content-Length", b"%d" % len(self.content))]
        )
        self.url = url
        self.headers = [*host, *kept, *own, *size]
        self.session_id = headers.get(MCP_SESSION_ID)

    def to(self, request: httpx2.Request) -> _Sent:
        """The same POST sent again where a redirect the SDK follows leads (httpx2's own
        next request: its URL and headers)."""
        again = _Sent.__new__(_Sent)
        again.content = self.content
        again.url = request.url
        again.headers = list(request.headers.raw)
        again.session_id = request.headers.get(MCP_SESSION_ID)
        return again

    def response(self, answer: outbound.Opened) -> httpx2.Response:
        """The answer as httpx2's Response to this request (its body not carried)."""
        request = httpx2.Request("POST", self.url, headers=self.headers, content=self.content)
        return httpx2.Response(answer.status, headers=answer.raw, request=request)


def _redirect(
    client: httpx2.AsyncClient, sent: _Sent, answer: outbound.Opened
) -> httpx2.Response | None:
    """The answer as httpx2's client hands back a redirect it does not follow (its
    `next_request` set, when its Location is one httpx2 can read), or None when the answer
    is no redirect."""
    if answer.status not in REDIRECTS or "location" not in answer.headers:
        return None
    response = sent.response(answer)
    with contextlib.suppress(httpx2.RemoteProtocolError):
        response.next_request = client._build_redirect_request(response.request, response)
    return response


async def _events(answer: outbound.Opened, max_event_size: int | None) -> AsyncIterator[Any]:
    """The answer's server-sent events, as httpx2's `EventSource` reads them from
    `Response.aiter_text`: its content type checked, its body decoded by its charset
    (UTF-8 when it names none, or none Python knows), errors replaced, each event at most
    `max_event_size` bytes (SSEError)."""
    content_type = answer.headers.get("content-type", "").partition(";")[0].strip()
    if content_type.lower() != "text/event-stream":
        raise httpx2.SSEError(
            f"Expected response with content type 'text/event-stream', got {content_type!r}."
        )
    charset = _parse_content_type_charset(answer.headers.get("content-type", ""))
    encoding = charset if charset is not None and _is_known_encoding(charset) else "utf-8"
    decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
    parser = _SSEParser(max_event_size)
    async for chunk in answer.body:
        if text := decoder.decode(chunk):
            for sse in parser.decode(text):
                yield sse
    if text := decoder.decode(b"", True):
        for sse in parser.decode(text):
            yield sse
    for sse in parser.flush():
        yield sse


@asynccontextmanager
async def _http_streams(url: str, http: httpx2.AsyncClient) -> AsyncIterator[Any]:
    """`mcp.client.streamable_http.streamable_http_client(url, http_client=http)`, with
    `_Transport`."""
    transport = _Transport(url)
    read_writer, read = create_context_streams[SessionMessage | Exception](0)
    write, write_reader = create_context_streams[SessionMessage](0)
    async with read_writer, read, write, write_reader, anyio.create_task_group() as tg:

        def start_get_stream() -> None:
            tg.start_soon(transport.handle_get_stream, http, read_writer)

        tg.start_soon(
            transport.post_writer, http, write_reader, read_writer, write, start_get_stream, tg
        )
        try:
            yield read, write, transport
        finally:
            if transport.session_id:
                await transport.terminate_session(http)
            tg.cancel_scope.cancel()


# --- A tools/call sent straight through the session's transport -------------------------

# Whether a call on an HTTP session is sent by `lean_call` when it can be (docs/mcp.md,
# "The upstream call"); off, every call goes through the SDK's ClientSession.call_tool.
LEAN_CALLS = True
_LEAN_IDS = count(1)
# The statuses httpx2 reads a Location of (`Response.has_redirect_location`).
REDIRECTS = frozenset((301, 302, 303, 307, 308))


class _Answer:
    """What `lean_call` hands the SDK's POST handling as the session's read stream: the
    call's response (or error), under the call's own id, is kept; any other message the
    server sends on the call's stream (a notification, a request of its own, a response
    under another id: a JSON body's id is not rewritten, an SSE event's is) goes on to the
    session, as the SDK's transport sends it, whose dispatcher routes it by its id."""

    def __init__(self, session_stream: Any, request_id: str) -> None:
        self.session_stream = session_stream
        self.request_id = request_id
        self.reply: types.JSONRPCResponse | types.JSONRPCError | None = None

    async def send(self, item: SessionMessage | Exception) -> None:
        message = item.message if isinstance(item, SessionMessage) else None
        if (
            self.reply is None
            and isinstance(message, types.JSONRPCResponse | types.JSONRPCError)
            and message.id == self.request_id
        ):
            self.reply = message
        else:
            await self.session_stream.send(item)


def lean_ready(session: ClientSession, transport: _Transport) -> bool:
    """Whether `lean_call` may send a call on this session now: its sender has started
    and holds no notification (a later message waits behind one: so does the call, through
    the SDK), the protocol is one before 2026 (whose calls carry more headers and are
    cancelled by closing their stream), the server has set no cookie (which httpx2's
    client sends back, and `_Sent` does not; nor would it run an auth flow or a request
    hook, which `open_session`'s client has none of), and the endpoint's URL names no
    user (whose credentials httpx2's client sends as Basic auth: `_Transport.credentialed`)."""
    version = transport._protocol_version_header
    client = transport.client
    return (
        LEAN_CALLS
        and client is not None
        and not transport.credentialed
        and not client.cookies
        and client.auth is None
        and not client.event_hooks["request"]
        and transport.incoming is not None
        and transport.notices == 0
        and version is not None
        and version not in MODERN_PROTOCOL_VERSIONS
        and session._negotiated_version not in MODERN_PROTOCOL_VERSIONS
    )


async def lean_call(
    session: ClientSession, transport: _Transport, tool: str, arguments: dict[str, Any]
) -> types.CallToolResult:
    """`session.call_tool(tool, arguments)` at a protocol before 2026, sent by the awaiting
    task itself through the transport's POST handling (`_Transport.lean_post`:
    the session's headers, the door, its JSON or SSE answer, 202, redirects and error
    statuses as the SDK reads them), and its result read as the session reads it (the
    protocol version's checks, the tool's output schema). What it leaves out is the SDK's
    way there and back: the request's model, the dispatcher's waiter, two memory streams,
    the sender's task and the reader's. Cancelled (its bound, or its caller), it sends the
    server the notice that cancels the request, as the SDK does. Raises as call_tool."""
    assert transport.client is not None
    params: dict[str, Any] = {"name": tool, "arguments": arguments}
    data: dict[str, Any] = {"method": "tools/call", "params": params}
    opts: Any = {}
    session._stamp(data, opts)
    headers = opts.setdefault("headers", {})
    headers.setdefault(MCP_NAME_HEADER, encode_header_value(tool))
    meta: dict[str, Any] = dict(data["params"].get("_meta") or {})
    inject_trace_context(meta)
    if meta:
        data["params"]["_meta"] = meta
    plan = jsonrpc_dispatcher._plan_outbound(None, opts)
    request_id = f"harness-{next(_LEAN_IDS)}"
    message = types.JSONRPCRequest(
        jsonrpc="2.0", id=request_id, method="tools/call", params=data["params"]
    )
    metadata = plan.metadata if isinstance(plan.metadata, ClientMessageMetadata) else None
    if metadata is not None and metadata.headers is not None:
        stamped = metadata.headers.get(MCP_PROTOCOL_VERSION_HEADER)
        if stamped is not None:
            transport._protocol_version_header = stamped
    answer = _Answer(transport.incoming, request_id)
    ctx = RequestContext(
        client=transport.client,
        session_id=transport.session_id,
        session_message=SessionMessage(message, metadata=plan.metadata),
        metadata=metadata,
        read_stream_writer=answer,  # type: ignore[arg-type]
    )
    try:
        await transport.lean_post(ctx)
    except asyncio.CancelledError:
        if plan.cancel_on_abandon:
            dispatcher = session._dispatcher
            assert isinstance(dispatcher, jsonrpc_dispatcher.JSONRPCDispatcher)
            await dispatcher._final_write(
                partial(dispatcher._cancel_outbound, request_id, "caller cancelled", None),
                shield=True,
                timeout=jsonrpc_dispatcher._ABANDON_WRITE_TIMEOUT,
                describe=f"courtesy cancel for caller-cancelled request {request_id!r}",
            )
        raise
    reply = answer.reply
    if reply is None:
        # The server's answer held no response under the call's id (a JSON body that is
        # a request or notification of its own, or a response under another id): the
        # SDK's waiter for the call is never resolved, and the call ends at its bound
        # (Pool._call_on's) as it does there, timed out, its session replaced.
        await anyio.sleep_forever()
        raise AssertionError("unreachable")
    if isinstance(reply, types.JSONRPCError):
        error = reply.error
        raise MCPError(code=error.code, message=error.message, data=error.data)
    raw = reply.result
    sdk_session._clamp_inbound_ttl(raw)
    version = session._negotiated_version or "2025-11-25"
    with contextlib.suppress(KeyError):
        sdk_methods.validate_server_result("tools/call", version, raw)
    if not (foreign := sdk_session._later_revision_fields("tools/call", version)).isdisjoint(raw):
        raw = {key: value for key, value in raw.items() if key not in foreign}
    adapter = session._call_tool_adapter
    if isinstance(adapter, pydantic.TypeAdapter):
        result = adapter.validate_python(raw, by_name=False)
    else:
        result = adapter.model_validate(raw, by_name=False)
    if isinstance(result, types.CallToolResult) and not result.is_error:
        await session.validate_tool_result(tool, result)
    if isinstance(result, types.InputRequiredResult):
        raise sdk_session._input_required_unexpected("call_tool")
    if not isinstance(result, types.CallToolResult):
        raise UnexpectedClaimedResult(result)
    return result


async def all_tools(session: ClientSession) -> list[types.Tool]:
    """Every tool the server lists, through its pages."""
    tools: list[types.Tool] = []
    cursor = None
    for _ in range(MAX_PAGES):
        result = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
        tools += result.tools
        cursor = result.next_cursor
        if not cursor:
            break
    return tools


def list_definitions(endpoint: Endpoint) -> list[Definition]:
    """The server's tools now (a session of its own). Raises UpstreamError."""

    async def fetch() -> list[Definition]:
        async with asyncio.timeout(CONNECT_TIMEOUT + endpoint.timeout):
            async with open_session(endpoint) as session:
                return [Definition.from_mcp(tool) for tool in await all_tools(session)]

    try:
        definitions: list[Definition] = _run_fresh(fetch())
    except Exception as exc:
        raise UpstreamError(describe(exc)) from exc
    return definitions


def _run_fresh(coroutine: Any) -> Any:
    """Run a coroutine to completion on a fresh loop, in a thread if this one runs one."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coroutine))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            error.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def describe(exc: BaseException) -> str:
    """A short account of a failure (the first leaf of an exception group)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return f"{exc.error.message} (MCP error {exc.error.code})"
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    if isinstance(exc, outbound.OutboundRefused):
        return f"{exc} (Harness's outbound policy; an admin may list it in HARNESS_OUTBOUND_ALLOW)"
    if isinstance(exc, pydantic.ValidationError):  # (its text quotes the input at length)
        return f"it answered what is not a valid {exc.title}"
    if isinstance(exc, RuntimeError) and str(exc):  # the SDK's account of a bad result
        return str(exc).splitlines()[0][:300]
    if isinstance(exc, ToolError):  # written for the reader already (the sandbox's)
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# --- The worker's pool of open sessions ---------------------------------------------------


# A call that waited for a session of its server's configuration when a call of another
# configuration of the server (changed, or registered again) retired it: the call is not
# sent, and no new session of the old configuration is opened for it (its URL or
# credentials used again after the change, the new configuration's session retired for it).
SUPERSEDED = "its configuration changed while the call waited for the server, so it was not sent"
# How many replaced configurations a loop remembers, so that a call resolved before a change
# never reopens them (`Pool._connection`); each is a few hundred bytes.
MAX_SUPERSEDED = 1000


class Connection:
    """One open session with one server, held by a task of the loop it is on: `turns`
    calls in flight on it at once (an HTTP server's: HTTP_IN_FLIGHT; a stdio server's:
    one); `users`, the calls in flight now. Replaced (`retire`), it takes no new call and
    is closed when its last call in flight has ended, not under them."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.session: ClientSession | None = None
        self.transport: _Transport | None = None  # (an HTTP server's: lean_call)
        self.definitions: dict[str, Definition] = {}
        self.ready = asyncio.Event()
        self.stop = asyncio.Event()
        self.error: BaseException | None = None
        self.turns = asyncio.Semaphore(1 if endpoint.transport == "stdio" else HTTP_IN_FLIGHT)
        self.users = 0
        self.retired = False
        # (retired for a newer configuration of its server: a call that waited for it is
        # not sent, rather than open the old configuration's session again)
        self.superseded = False
        self.forgotten = False  # (the server answered 404: it no longer knows the session)
        self.too_large = False  # (a stdio server sent a message past ANSWER_BYTES)
        self.task = asyncio.create_task(self._hold(), name=f"mcp-{endpoint.name}")

    async def _hold(self) -> None:
        try:
            async with open_session(
                self.endpoint, self._forgotten, self._too_large, self._opened
            ) as session:
                tools = await all_tools(session)
                self.definitions = {t.name: Definition.from_mcp(t) for t in tools}
                self.session = session
                self.ready.set()
                await self.stop.wait()
        except BaseException as exc:  # noqa: BLE001 - kept for the caller
            self.error = exc
        finally:
            self.session = None
            self.ready.set()

    def _forgotten(self) -> None:
        self.forgotten = True

    def _opened(self, transport: _Transport) -> None:
        self.transport = transport

    def _too_large(self) -> None:
        self.too_large = True

    @property
    def alive(self) -> bool:
        return not self.task.done() and not self.stop.is_set()

    def retire(self) -> None:
        """Closed now if no call is in flight on it, else when the last one ends
        (`leave`), in the background."""
        self.retired = True
        self._close_if_idle()

    def supersede(self) -> None:
        """Retired for a newer configuration of its server (SUPERSEDED)."""
        self.superseded = True
        self.retire()

    def leave(self) -> None:
        """A call in flight on it has ended."""
        self.users -= 1
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if self.retired and self.users == 0:
            asyncio.get_running_loop().create_task(self.close())

    async def close(self) -> None:
        """The session ended (its task given 5 s, then cancelled, and a moment to end).
        A caller cancelled meanwhile is cancelled (the task too): its cancellation is
        never swallowed here."""
        self.stop.set()
        try:
            if not (await asyncio.wait({self.task}, timeout=5))[0]:
                self.task.cancel()
                await asyncio.wait({self.task}, timeout=1)
        except asyncio.CancelledError:
            self.task.cancel()
            raise


class Pool:
    """Per process: a loop thread and the open connections, by server configuration."""

    def __init__(self) -> None:
        self._pid = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        # The open connections of each loop: the pool's own, and those of the web
        # requests' loops (`loop_for`); a connection is used only on the loop it is on.
        self._connections: dict[asyncio.AbstractEventLoop, dict[Endpoint, Connection]] = {}
        # The configurations each loop has seen replaced by a newer one of their server
        # (oldest first, at most MAX_SUPERSEDED): never opened again on that loop.
        self._superseded: dict[asyncio.AbstractEventLoop, dict[Endpoint, None]] = {}
        # The configurations of servers the catalog saw removed (oldest first, at most
        # MAX_SUPERSEDED): never opened again, on any loop, those that held no session of
        # them when the removal was seen included.
        self._removed: dict[Endpoint, None] = {}
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():  # new, or a forked child
                self._pid = os.getpid()
                self._connections, self._superseded = {}, {}
                self._loop = asyncio.new_event_loop()
                threading.Thread(
                    target=self._loop.run_forever, name="mcp-upstream", daemon=True
                ).start()
            return self._loop

    def loop_for(
        self, endpoint: Endpoint, loop: asyncio.AbstractEventLoop | None
    ) -> asyncio.AbstractEventLoop:
        """Where a call of `endpoint` runs: on `loop`, the event loop of the web request
        that awaits the call (ExecutionContext.loop), for an HTTP server, rather than
        handed to the pool's loop thread and back (docs/benchmarks.md, S14); else, and
        for a stdio server (a process, which outlives any request), on the pool's own.
        Never on the loop this thread runs (it would wait on itself)."""
        if loop is None or endpoint.transport == "stdio" or not loop.is_running():
            return self.loop()
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        return self.loop() if here is loop else loop

    def call(
        self,
        endpoint: Endpoint,
        tool: str,
        fingerprint: str,
        arguments: dict[str, Any],
        loop: asyncio.AbstractEventLoop | None = None,
        deadline: float | None = None,
    ) -> types.CallToolResult:
        """Call `tool` with `arguments` (on `loop`: `loop_for`); raises ToolError (what
        the model reads), TimeoutError (past the tool's timeout), DefinitionChanged or
        UpstreamError. A call still waiting for its session (starting, or busy with
        other calls) when its timeout has passed is not sent: its host has given up on
        it (pipeline.execute's backstop, a second past `deadline`, the call's own:
        ExecutionContext.deadline) and told its agent it timed out."""
        ends = time.monotonic() + endpoint.timeout
        deadline = ends if deadline is None else min(ends, deadline)
        future = asyncio.run_coroutine_threadsafe(
            self._call(endpoint, tool, fingerprint, arguments, deadline),
            self.loop_for(endpoint, loop),
        )
        try:
            return future.result(timeout=endpoint.timeout + CONNECT_TIMEOUT)
        except TimeoutError:
            future.cancel()
            raise

    async def call_async(
        self,
        endpoint: Endpoint,
        tool: str,
        fingerprint: str,
        arguments: dict[str, Any],
        deadline: float | None = None,
    ) -> types.CallToolResult:
        """`call`, awaited on the running loop (the web request's, which runs the call
        inline: Tool.execute_async), holding no thread while the server answers. A stdio
        server's session lives on the pool's own loop: its call is made there, from a
        thread."""
        if endpoint.transport == "stdio":
            return await asyncio.to_thread(
                self.call, endpoint, tool, fingerprint, arguments, None, deadline
            )
        ends = time.monotonic() + endpoint.timeout
        deadline = ends if deadline is None else min(ends, deadline)
        return await asyncio.wait_for(
            self._call(endpoint, tool, fingerprint, arguments, deadline),
            endpoint.timeout + CONNECT_TIMEOUT,
        )

    async def _connection(self, endpoint: Endpoint) -> Connection:
        """The open connection, started again if it died (a crashed stdio server). One of
        an older configuration of the server is retired: it takes no new call, and the
        calls in flight on it end as they would have (they were sent; cutting the client
        would not stop the server, only lose their answers); nobody waits for its close."""
        connections = self._on_this_loop()
        superseded = self._superseded.setdefault(asyncio.get_running_loop(), {})
        if endpoint.key in superseded or endpoint.key in self._removed:
            # A call resolved before its server's configuration changed, arriving after a
            # call of the new one: not sent, and the old configuration (its URL, headers,
            # a stdio server's command and environment) not opened again, nor the new
            # one's session retired for it.
            raise UpstreamError(SUPERSEDED)
        # (the same when this loop never had the old configuration's session: a newer
        # one of the server, or of a server registered since under its name, is open
        # here; ids and versions only grow, on SQLite too: AUTOINCREMENT)
        if any(_newer(key, endpoint) for key in connections):
            raise UpstreamError(SUPERSEDED)
        for key, old in list(connections.items()):
            same_server = key.server_id == endpoint.server_id or key.name == endpoint.name
            if same_server and key != endpoint.key:  # its configuration changed
                del connections[key]
                old.supersede()
                self._remember(key)
        connection = connections.get(endpoint.key)
        if (
            connection is not None
            and connection.alive
            and connection.endpoint.transport == "stdio"
            and connection.session is not None
            and not await _answers_ping(connection.session)
        ):
            await connection.close()
        if connection is None or not connection.alive:
            connection = connections[endpoint.key] = Connection(endpoint)
        await asyncio.wait_for(connection.ready.wait(), CONNECT_TIMEOUT)
        if connection.superseded:
            raise UpstreamError(SUPERSEDED)
        if connection.session is None:
            # (only this one: every call that waited for it comes here, and a call may
            # already have started the next one under the same key)
            if connections.get(endpoint.key) is connection:
                del connections[endpoint.key]
            raise UpstreamError(describe(connection.error or RuntimeError("not connected")))
        return connection

    async def _call(
        self,
        endpoint: Endpoint,
        tool: str,
        fingerprint: str,
        arguments: dict[str, Any],
        deadline: float,
    ) -> types.CallToolResult:
        # A call that waited its turn behind one that broke or timed out finds the
        # connection replaced, and goes to the new one, as long as its time lasts: each
        # replacement is a call ahead of it that failed (two `never` calls ahead of it
        # replace the session twice). A connection that died by itself (not replaced)
        # counts as broken; twice, and the call is not sent. (The SDK's client tells a
        # server about a timed-out request before it raises, so the call behind may be
        # let in before the replacement.)
        broken = 0
        while True:
            connection = await self._connection(endpoint)
            async with connection.turns:  # (HTTP_IN_FLIGHT; a stdio server's: one)
                left = deadline - time.monotonic()
                # (`call`: its host has given up; it is not sent. Checked first: a call
                # that waited past its timeout behind calls that timed out, each replacing
                # the connection, timed out too; its connection did not break.)
                if left <= 0:
                    raise TimeoutError("it waited past its timeout for the server")
                if connection.superseded:  # (not another session of the old configuration)
                    raise UpstreamError(SUPERSEDED)
                current = self._on_this_loop().get(endpoint.key)
                if current is connection and connection.alive:
                    # (its answer is of no use past the host's backstop, a second on)
                    read = min(endpoint.timeout, left + 1)
                    return await self._call_on(connection, tool, fingerprint, arguments, read)
                if current is connection or current is None:  # not replaced: it broke
                    broken += 1
                    if broken == 2:
                        raise UpstreamError("its connection broke twice while the call waited")

    async def _call_on(
        self,
        connection: Connection,
        tool: str,
        fingerprint: str,
        arguments: dict[str, Any],
        read_timeout: float,
    ) -> types.CallToolResult:
        """The call on `connection`, in one of its turns, given `read_timeout` seconds to
        answer."""
        endpoint = connection.endpoint
        seen = connection.definitions.get(tool)
        if seen is None or seen.fingerprint != fingerprint:
            raise DefinitionChanged(seen)
        assert connection.session is not None
        connection.users += 1
        # (The SDK's read timeout starts once the request is handed to its sender, which
        # sends one notification at a time: a server holding a cancel notice holds the
        # next request before it is sent. Bounded here too, from the start, so a request
        # still waiting to be sent when the call's time is up is not sent: a call on the
        # pool's loop is otherwise cancelled only CONNECT_TIMEOUT after it.)
        bound = asyncio.timeout(read_timeout)
        try:
            async with bound:
                transport = connection.transport
                if transport is not None and lean_ready(connection.session, transport):
                    return await lean_call(connection.session, transport, tool, arguments)
                return await connection.session.call_tool(
                    tool, arguments, read_timeout_seconds=read_timeout
                )
        except TimeoutError as exc:
            self._replace(connection)
            if not bound.expired():  # (a socket's own: as OSError, below)
                raise UpstreamError(describe(exc)) from exc
            raise TimeoutError("no answer within its timeout") from exc
        except MCPError as exc:
            if exc.error.code == types.REQUEST_TIMEOUT:
                self._replace(connection)  # a stdio server stops what it was doing
                raise TimeoutError(exc.error.message) from exc
            if exc.error.code == types.CONNECTION_CLOSED:
                self._replace(connection)
                if connection.too_large:  # (the server is stopped: its session ended)
                    raise UpstreamError(f"its answer was larger than {ANSWER_BYTES} bytes") from exc
                raise ToolError(messages_crashed(endpoint.name, tool)) from exc
            if connection.forgotten:  # (the next call gets a new session, not this one)
                self._replace(connection)
            raise UpstreamError(describe(exc)) from exc
        except (pydantic.ValidationError, RuntimeError) as exc:
            # What the server answered is no tool result (or not one its own output
            # schema allows, or one that asks for input): the server's fault, told as
            # such; the session itself still works.
            raise UpstreamError(describe(exc)) from exc
        except (
            OSError,
            httpx2.HTTPError,
            outbound.OutboundRefused,
            anyio.ClosedResourceError,
            anyio.BrokenResourceError,
        ) as exc:
            self._replace(connection)
            raise UpstreamError(describe(exc)) from exc
        finally:
            connection.leave()

    def _replace(self, connection: Connection) -> None:
        """Retire a connection that timed out or broke (closed in the background once no
        other call is in flight on it: a call of a slow tool that timed out does not cut
        the others' calls) and start the next one now, so that the next call finds the
        server started again. (A session that broke under all its calls has already failed
        them: the server stopped while they ran.)"""
        connection.retire()
        connections = self._on_this_loop()
        if connections.get(connection.endpoint.key) is connection:
            connections[connection.endpoint.key] = Connection(connection.endpoint)

    def keep_only(self, offered: Collection[Endpoint], removed: Collection[Endpoint] = ()) -> None:
        """Retire, on each loop, the sessions of configurations no longer offered (a server
        removed, changed, or with none of its tools offered), as the process sees the
        change (catalog._build): a removed server's session, a stdio server's process with
        its environment, is not kept open until the process ends, or until a server of its
        name is registered again. A call waiting for one is not sent (SUPERSEDED); those in
        flight end as they would have. `removed`: the configurations (held here, or offered
        by the catalog) of servers that no longer exist (ids are never used again: a
        sequence, SQLite's AUTOINCREMENT), refused on every loop from now on. From any
        thread."""
        keep = frozenset(offered)
        with self._lock:
            for key in removed:
                _bounded_add(self._removed, key)
            if self._pid and self._pid != os.getpid():  # (a forked child: its parent's loops)
                return
            loops = [loop for loop in self._connections if not loop.is_closed()]
        for loop in loops:
            with contextlib.suppress(RuntimeError):  # (it closed meanwhile)
                loop.call_soon_threadsafe(self._retire_all_but, keep)

    def held(self) -> set[Endpoint]:
        """The configurations this process holds a session of, on any loop (for
        catalog._build: which of their servers were removed). From any thread."""
        with self._lock:
            kept = [list(connections) for connections in self._connections.values()]
        return {key for keys in kept for key in keys}

    def _retire_all_but(self, keep: frozenset[Endpoint]) -> None:
        connections = self._on_this_loop()
        for key, connection in list(connections.items()):
            if key not in keep:
                del connections[key]
                connection.supersede()
                # Replaced by a newer configuration of its server (or of a server registered
                # since under its name): remembered, as when a call of the new one replaces
                # it (`_connection`), so that a call resolved before the change, arriving
                # before any call of the new one, does not open it again (the old URL and
                # headers used after the change). Not one merely no longer offered (its
                # tools awaiting review): it may be offered again. (A removed server's are
                # in `_removed`, for every loop.)
                if any(_newer(other, key) for other in keep):
                    self._remember(key)

    def _remember(self, key: Endpoint) -> None:
        """`key` replaced on the running loop: never opened there again."""
        _bounded_add(self._superseded.setdefault(asyncio.get_running_loop(), {}), key)

    def _on_this_loop(self) -> dict[Endpoint, Connection]:
        """The running loop's connections (those of loops that closed are forgotten)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            for other in [other for other in self._connections if other.is_closed()]:
                del self._connections[other]
                self._superseded.pop(other, None)
            return self._connections.setdefault(loop, {})


def _bounded_add(memo: dict[Endpoint, None], key: Endpoint) -> None:
    """`key` added to `memo`, which keeps the newest MAX_SUPERSEDED (oldest dropped)."""
    memo[key] = None
    while len(memo) > MAX_SUPERSEDED:
        del memo[next(iter(memo))]


def _newer(one: Endpoint, than: Endpoint) -> bool:
    """`one` is a newer configuration of `than`'s server (the same id, or a server registered
    since under its name): a greater (id, version)."""
    same_server = one.server_id == than.server_id or one.name == than.name
    return same_server and (one.server_id, one.version) > (than.server_id, than.version)


async def _answers_ping(session: ClientSession) -> bool:
    try:
        await asyncio.wait_for(session.send_ping(), 2)
    except Exception:  # noqa: BLE001 - any failure means: start it again
        return False
    return True


POOL = Pool()


# --- What the model reads ------------------------------------------------------------------


def messages_changed(server: str, tool: str) -> str:
    return (
        f"The MCP server '{server}' now describes its tool '{tool}' differently from the "
        "definition an admin approved, so Harness does not call it until an admin reviews "
        "the change (Tools page, or `manage.py refresh_mcp_server`). Do not retry it; use "
        "another tool or ask the user."
    )


def messages_missing(server: str, tool: str) -> str:
    return (
        f"The MCP server '{server}' no longer offers a tool '{tool}'. Use another tool or "
        "ask the user to refresh the server's registration."
    )


def messages_crashed(server: str, tool: str) -> str:
    return (
        f"The MCP server '{server}' stopped while running '{tool}', so it is not known whether "
        "the call took effect. The server is started again for the next call; check the "
        "state before trying again."
    )


def result_text(result: types.CallToolResult) -> str:
    """The tool's content blocks as the text the model reads."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent | types.AudioContent):
            parts.append(f"[{block.type}: {block.mime_type}, {len(block.data)} base64 characters]")
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            text = getattr(resource, "text", None)
            parts.append(text if isinstance(text, str) else f"[resource {resource.uri}]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource link {block.uri}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, indent=2, ensure_ascii=False))
    return "\n".join(parts)


def execute(
    endpoint: Endpoint, tool: str, fingerprint: str, ctx: ExecutionContext, args: dict[str, Any]
) -> str:
    """The upstream tool's body in a worker: the call's logged argument bytes, parsed.
    Raises DefinitionChanged (see services.run_tool) and ToolError."""
    arguments = json.loads(ctx.raw_arguments) if ctx.raw_arguments else args
    try:
        result = POOL.call(endpoint, tool, fingerprint, arguments, ctx.loop, ctx.deadline)
    except UpstreamError as exc:
        raise _could_not_run(endpoint, tool, exc, ctx) from exc
    return _answer(endpoint, tool, result, ctx)


async def execute_async(
    endpoint: Endpoint, tool: str, fingerprint: str, ctx: ExecutionContext, args: dict[str, Any]
) -> str:
    """`execute` on the running loop (the inline lane: Tool.execute_async): the same
    request, the same errors."""
    arguments = json.loads(ctx.raw_arguments) if ctx.raw_arguments else args
    try:
        result = await POOL.call_async(endpoint, tool, fingerprint, arguments, ctx.deadline)
    except UpstreamError as exc:
        raise _could_not_run(endpoint, tool, exc, ctx) from exc
    return _answer(endpoint, tool, result, ctx)


def _could_not_run(
    endpoint: Endpoint, tool: str, exc: UpstreamError, ctx: ExecutionContext
) -> ToolError:
    text = (
        f"The MCP server '{endpoint.name}' could not run '{tool}': "
        f"{without_secrets(endpoint, str(exc)).rstrip('.')}. Try again later, or ask the "
        "user to check the server."
    )
    return ToolError(storable_text(text, ctx.output_limit))


def without_secrets(endpoint: Endpoint, text: str) -> str:
    """`text` (a failure's account, which may quote a request: an HTTP error names its
    URL) without the server's URL, header values or environment values, which may hold
    its credentials: the model reads it."""
    secrets = [endpoint.url, *(value for _, value in (*endpoint.headers, *endpoint.env))]
    for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        text = text.replace(secret, "[hidden]")
    return text


def _answer(
    endpoint: Endpoint, tool: str, result: types.CallToolResult, ctx: ExecutionContext
) -> str:
    """The server's result as the model reads it; raises ToolError for an error result."""
    text = storable_text(result_text(result), ctx.output_limit)
    if result.is_error:
        raise ToolError(text or f"The MCP server '{endpoint.name}' reported an error for '{tool}'.")
    return text


def storable_text(text: str, limit: int) -> str:
    """What an upstream server answered, as text every database keeps as it is (NUL
    characters written out, lone surrogates replaced), cut to `limit` with a note."""
    return cap_text(base.storable_text(text), limit, "ask the tool for less")
