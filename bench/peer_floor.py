"""S14f, the floor of Harness's guarantees for one auto-allowed upstream `tools/call` (issue
37): a raw ASGI application that does only what Harness must do for such a call, and
nothing else, served by daphne (Harness's server) and, as a second side, by uvicorn (the
server FastMCP's proxy runs on).

It speaks just enough Streamable HTTP MCP for the SDK's `ClientSession`: `initialize`
(a session row, its `session.started` event and its chain's head), the
`notifications/initialized` notification (202), `tools/list` (the upstream's one tool as
`up__echo`), `tools/call`, and DELETE; a GET (the server-initiated stream) is 405, as on
Harness. Answers are plain JSON (`application/json`, which the SDK's client accepts): the
least a server may send.

Per `tools/call`, with no Harness code on the way but the audit's hash and signature
functions (`audit.services.canonical_event`, `chain_hash`, `audit.signing.sign_head`), on
one psycopg connection of a small pool (async, on the event loop: no thread hop),
prepared statements against the real tables:

1. the token read: the agent's session by the token's prefix and hash and the client's
   session id, the agent and its owner active (one SELECT, as Harness's authentication
   reads them in one statement: Harness's also loads what its policy reads);
2. one transaction: the call INSERTed, with its arguments and their digest, already
   `running` with its claim (`attempts = 1`, the lease), together with the chain head's
   lock (`FOR UPDATE`) in one `WITH`, as Harness sends it; then its three events
   (`call.received` with the digest, `call.allowed`, `call.started`: the claim), hashed
   into the chain, INSERTed with the head's UPDATE (signed) in one `WITH`; COMMIT
   (durable: `synchronous_commit` as configured) before the upstream is called;
3. the upstream call on one MCP session kept per process (the SDK's
   `streamable_http_client` + `ClientSession`, its HTTP connection kept by reading the
   rest of each SSE answer, as Harness's outbound door does), under the call's timeout;
4. one transaction: the result's conditional UPDATE (`status = 'running'`) with the head's
   lock, then its `call.completed` event with the head; COMMIT (durable);
5. the answer: the upstream's result as it came.

No policy, no guards, no masking, no repeat count, no wake-up, no rate limits or waits, no
Django request handling, no MCP SDK server: what is left is the price of the guarantees
on this stack. bench/peer.py runs it as S14's Hf (daphne) and Hf-uvicorn.

With BENCH_FLOOR_DJANGO=1 (S14's Hd) the same statements go through Django's database
layer as Harness's do: its psycopg pool and connection wrapper (`transaction.atomic`,
its cursor wrapper, prepared on the server as Harness's fixed statements are:
`floor.compiled.fixed_cursor`), on a pool of threads as Harness's gateway runs its ORM work (`sync_to_async`
on its own executor), in Harness's trips: the token read on one; the store, the upstream
call (handed back to the event loop, the connection given back to the pool meanwhile, as
`execution.run_inline` does) and the result on a second. No ORM models, no policy: what
Django's database layer and the thread hops add to the floor.

With BENCH_FLOOR_ASYNC_DJANGO=1 (S14's Ha) the statements go through django-async-backend
on the loop; on it, S14L's ladder (bench/peer_ladder.py) adds Harness's Redis commands for
the call (BENCH_FLOOR_REDIS=1: Har) and the MCP SDK's reading and writing of the request
(BENCH_FLOOR_SDK=1 as well: Has), each at its cheapest.

    daphne -b 127.0.0.1 -p PORT bench.peer_floor:application
    uvicorn bench.peer_floor:application --host 127.0.0.1 --port PORT --lifespan off

Environment: bench/run.py's (DATABASE_URL, DJANGO_SETTINGS_MODULE, HARNESS_DATA_DIR: the
audit key), and BENCH_FLOOR_UPSTREAM, the upstream's URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import hmac
import json
import os
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

import django  # noqa: E402

django.setup()  # (the audit key's settings: sign_head reads them)

import httpx2  # noqa: E402
import psycopg  # noqa: E402

from audit.services import GENESIS_HASH  # noqa: E402
from audit.signing import sign_head  # noqa: E402
from bench.floor import event_row  # noqa: E402

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

TOOL = "up__echo"  # as Harness names the upstream `up`'s `echo`
UPSTREAM_TOOL = "echo"
CLIENT = "mcp"
TIMEOUT = 60.0  # the call's host-side timeout (Harness's default for an upstream tool)
POOL_SIZE = 8  # S14's 8 clients: one connection each at most, opened before they run
# BENCH_FLOOR_GUARANTEES=0: no database at all, a bare proxy on the same server (S14's
# Hp, on request: what the server and the upstream client cost without the guarantees).
GUARANTEES = os.environ.get("BENCH_FLOOR_GUARANTEES", "1") != "0"
# BENCH_FLOOR_DJANGO=1: the statements through Django's database layer on threads (Hd).
THROUGH_DJANGO = os.environ.get("BENCH_FLOOR_DJANGO") == "1"
# BENCH_FLOOR_ASYNC_DJANGO=1 (with DJANGO_SETTINGS_MODULE=bench.settings_async): through
# django-async-backend's async connection, pool and transactions, on the loop (Ha).
THROUGH_ASYNC_DJANGO = os.environ.get("BENCH_FLOOR_ASYNC_DJANGO") == "1"
# The ladder above Ha (S14's Har and Has, issue 37): what two parts of Harness's own work
# cost at their cheapest, on Ha's async connection.
# BENCH_FLOOR_REDIS=1: Harness's Redis commands for such a call (the S14 caps it keeps on:
# the wait slot, the wake-ups), made on the loop with redis-py's asyncio client, no
# thread, as little on the call's way as they can be: the agent's wait slot taken with
# Harness's own script (dispatcher.limits._RESERVE) beside the token read; the result's
# wake-up on the session's channel (dispatcher.wakeups) and the slot given back in one
# pipeline after the answer. (No wake-up of the claim: Harness sends none for a body
# that answers within RUNNING_NOTICE_AFTER.)
WITH_REDIS = os.environ.get("BENCH_FLOOR_REDIS") == "1"
# BENCH_FLOOR_SDK=1: the request read and the answer made with the MCP SDK's types, as
# Harness's fast path (dispatcher.gateways.mcp_fast) reads and makes them: the body by
# the SDK's message adapter, the revision's params check and `CallToolRequestParams`; the
# result shaped by the SDK's runner, its JSON-RPC response, answered as `application/json`
# (with BENCH_FLOOR_SSE=1 as one SSE `message` event, as the fast path writes it today).
WITH_SDK = os.environ.get("BENCH_FLOOR_SDK") == "1"
SDK_SSE = os.environ.get("BENCH_FLOOR_SSE") == "1"

# --- the statements -------------------------------------------------------------------------

TOKEN = (
    "SELECT s.id, s.mode, a.token_hash FROM dispatcher_agentsession s "
    "JOIN dispatcher_agent a ON a.id = s.agent_id JOIN auth_user u ON u.id = a.owner_id "
    "WHERE a.token_prefix = %s AND a.token_hash = %s AND a.is_active AND u.is_active "
    "AND s.client = %s AND s.external_id = %s"
)
AGENT = (
    "SELECT a.id, a.name, u.username, a.token_hash FROM dispatcher_agent a "
    "JOIN auth_user u ON u.id = a.owner_id "
    "WHERE a.token_prefix = %s AND a.token_hash = %s AND a.is_active AND u.is_active"
)
SESSION = (
    "WITH s AS (INSERT INTO dispatcher_agentsession "
    "(id, agent_id, team_id, title, mode, workspace, client, external_id, created_at, "
    "updated_at) SELECT %s, a.id, a.team_id, %s, %s, %s, %s, %s, %s, %s "
    "FROM dispatcher_agent a WHERE a.id = %s), "
    "e AS (INSERT INTO audit_auditevent "
    "(chain, session_id, seq, kind, actor, subject, payload, created_at, prev_hash, hash) "
    "VALUES (%s, %s, 1, %s, %s, %s, %s, %s, %s, %s) RETURNING id) "
    "INSERT INTO audit_auditchain (chain, session_id, agent, owner, title, mode, first_at, "
    "last_at, last_seq, last_hash, last_event_id, head_signature, tools, calls, allowed, "
    "asked, approved, denied, rejected, cancelled, expired, completed, errors, timed_out, "
    "outcome_unknown) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 1, %s, (SELECT id FROM e), %s, "
    "'', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)"
)
# The call stored, decided and claimed, with the head's lock (Harness's statement's shape).
STORE = (
    "WITH written AS (INSERT INTO dispatcher_toolcall (id, session_id, tool_use_id, name, "
    "raw_arguments, arguments, digest, dialect, batch_id, batch_index, batch_size, "
    "batch_all_sent, executor, status, decision, decided_by, reason, provenance, content, "
    "is_error, repeat_count, created_at, queued_at, enqueued_at, started_at, lease_until, "
    "attempts, timings) VALUES (%s, %s, %s, %s, %s, %s, %s, 'mcp', %s, 0, 1, true, "
    "'harness', 'running', 'allow', %s, %s, %s, '', false, 1, %s, %s, %s, %s, %s, 1, '{}') "
    "RETURNING 1) "
    "SELECT last_seq, last_hash FROM audit_auditchain "
    "WHERE chain = %s AND (SELECT count(*) FROM written) > 0 FOR UPDATE"
)
FINISH = (
    "WITH written AS (UPDATE dispatcher_toolcall SET status = 'completed', content = %s, "
    "is_error = %s, timings = %s, finished_at = %s WHERE id = %s AND status = 'running' "
    "RETURNING 1) "
    "SELECT last_seq, last_hash FROM audit_auditchain "
    "WHERE chain = %s AND (SELECT count(*) FROM written) > 0 FOR UPDATE"
)
_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
_APPEND = (
    "WITH e AS (INSERT INTO audit_auditevent "
    "(chain, session_id, seq, kind, actor, subject, payload, created_at, prev_hash, hash) "
    "VALUES {rows} RETURNING id, seq) "
    "UPDATE audit_auditchain SET last_seq = %s, last_hash = %s, last_at = %s, "
    "head_signature = %s, calls = calls + %s, allowed = allowed + %s, "
    "completed = completed + %s, last_event_id = (SELECT id FROM e ORDER BY seq DESC LIMIT 1) "
    "WHERE chain = %s"
)
APPEND_3 = _APPEND.format(rows=", ".join([_ROW] * 3))
APPEND_1 = _APPEND.format(rows=_ROW)

MODE_REASON = "The session is in trusted mode: tools run unless a rule or guard stops them."


# --- the database: a few async connections, each request one at a time ---------------------


class Pool:
    """POOL_SIZE psycopg connections (autocommit: each transaction is explicit), opened
    together on first use so that none opens inside a measured window."""

    def __init__(self) -> None:
        self._free: asyncio.Queue[psycopg.AsyncConnection[Any]] | None = None
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self._free is None:
            async with self._lock:
                if self._free is None:
                    free: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
                    for _ in range(POOL_SIZE):
                        free.put_nowait(
                            await psycopg.AsyncConnection.connect(
                                os.environ["DATABASE_URL"], autocommit=True
                            )
                        )
                    self._free = free
        conn = await self._free.get()
        try:
            yield conn
        finally:
            self._free.put_nowait(conn)


pool = Pool()


Events = list[tuple[str, str, str, dict[str, Any], dt.datetime]]


def appended(
    head: tuple[int, str],
    chain: str,
    session: uuid.UUID,
    events: Events,
    counts: tuple[int, int, int],
) -> tuple[str, list[Any]]:
    """The statement appending `events` (kind, actor, subject, payload, at) after `head`
    (locked), with the head moved and signed, and its values."""
    seq, prev = head
    values: list[Any] = []
    for kind, actor, subject, payload, at in events:
        seq += 1
        row, prev = event_row(chain, session, seq, prev, kind, actor, subject, payload, at)
        values += row
    values += [seq, prev, events[-1][4], sign_head(chain, seq, prev), *counts, chain]
    return (APPEND_3 if len(events) == 3 else APPEND_1), values


@dataclass
class Call:
    """One `tools/call`'s values, the same for every side: its row, its events."""

    session: uuid.UUID
    mode: str
    request_id: Any
    arguments: dict[str, Any]
    call_id: uuid.UUID = field(default_factory=uuid.uuid4)
    batch: uuid.UUID = field(default_factory=uuid.uuid4)
    received: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))

    def __post_init__(self) -> None:
        self.raw = json.dumps(
            self.arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        self.digest = hashlib.sha256(self.raw.encode()).hexdigest()
        self.chain, self.subject = str(self.session), f"call:{self.call_id}"
        self.decided = {
            "mode": self.mode,
            "action": "allow",
            "by": f"mode:{self.mode}",
            "reason": MODE_REASON,
        }
        self.transition = {"call_id": str(self.call_id), "tool": TOOL}

    def store(self) -> tuple[str, tuple[Any, ...]]:
        """The call stored, decided and claimed, with the chain head's lock."""
        now = dt.datetime.now(dt.UTC)
        self.now = now
        return STORE, (
            *(self.call_id, self.session, f"mcp:{self.request_id}", TOOL, self.raw, self.raw),
            *(self.digest, self.batch, f"mode:{self.mode}", MODE_REASON),
            *(json.dumps(self.decided), self.received, now, now, now),
            *(now + dt.timedelta(seconds=TIMEOUT + 1), self.chain),
        )

    def admitted(self, head: tuple[int, str]) -> tuple[str, list[Any]]:
        """Its call.received, call.allowed and call.started (the claim) after `head`."""
        received = {
            "call_id": str(self.call_id),
            "tool_use_id": f"mcp:{self.request_id}",
            "tool": TOOL,
            "arguments": self.raw,
            "digest": self.digest,
            "dialect": "mcp",
            "batch_id": str(self.batch),
            "batch_index": 0,
        }
        started = {**self.transition, "from": "queued", "to": "running", "attempt": 1}
        events: Events = [
            ("call.received", "agent", self.subject, received, self.received),
            (
                "call.allowed",
                f"mode:{self.mode}",
                self.subject,
                {**self.transition, **self.decided},
                self.now,
            ),
            ("call.started", "inline", self.subject, {**started, "timeout": TIMEOUT}, self.now),
        ]
        return appended(head, self.chain, self.session, events, (1, 1, 0))

    def finish(self, content: str, is_error: bool, seconds: float) -> tuple[str, tuple[Any, ...]]:
        """The result's conditional UPDATE with the head's lock."""
        self.finished, self.outcome = dt.datetime.now(dt.UTC), (content, is_error, seconds)
        timings = json.dumps({"execute_s": seconds})
        return FINISH, (content, is_error, timings, self.finished, self.call_id, self.chain)

    def completed(self, head: tuple[int, str]) -> tuple[str, list[Any]]:
        content, is_error, seconds = self.outcome
        payload = {
            **self.transition,
            "from": "running",
            "to": "completed",
            "content": content,
            "is_error": is_error,
            "seconds": seconds,
        }
        event = ("call.completed", "worker", self.subject, payload, self.finished)
        return appended(head, self.chain, self.session, [event], (0, 0, 1))


# --- the upstream: one MCP session per process -----------------------------------------------


class _DrainedBody(httpx2.AsyncByteStream):
    """An answer's body that is read to its end when closed early (the SDK closes an SSE
    answer at its message, before the last chunk), so the connection is kept."""

    def __init__(self, stream: httpx2.AsyncByteStream) -> None:
        self._stream = stream
        self._chunks: AsyncIterator[bytes] | None = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        if self._chunks is None:
            self._chunks = self._stream.__aiter__()
        return self._chunks

    async def aclose(self) -> None:
        try:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(0.25):
                    async for _ in self.__aiter__():
                        pass
        finally:
            await self._stream.aclose()


class _KeptTransport(httpx2.AsyncHTTPTransport):
    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        assert isinstance(response.stream, httpx2.AsyncByteStream)  # noqa: S101
        response.stream = _DrainedBody(response.stream)
        return response


class Upstream:
    """The upstream's MCP session, opened on first use by a task that holds it for the
    process's life (its context must be entered and left in one task); requests use it
    from their own tasks, as FastMCP's proxy uses its one connected client."""

    def __init__(self) -> None:
        self.session: Any = None
        self.tool: dict[str, Any] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def get(self) -> Any:
        if self.session is None:
            async with self._lock:
                if self.session is None:
                    ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    self._task = asyncio.ensure_future(self._hold(ready))
                    await ready
        return self.session

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        try:
            http = httpx2.AsyncClient(
                transport=_KeptTransport(), timeout=httpx2.Timeout(10, read=TIMEOUT + 5)
            )
            url = os.environ["BENCH_FLOOR_UPSTREAM"]
            async with (
                http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                listed = await session.list_tools()
                tool = next(t for t in listed.tools if t.name == UPSTREAM_TOOL)
                self.tool = {
                    **tool.model_dump(by_alias=True, mode="json", exclude_none=True),
                    "name": TOOL,
                }
                self.session = session
                ready.set_result(None)
                await asyncio.Event().wait()  # held until the process ends
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise


upstream = Upstream()


# --- the protocol ----------------------------------------------------------------------------


async def application(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    headers: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        headers.setdefault(name.lower(), value)
    method = scope["method"]
    if method == "GET":
        return await respond(send, 405, b"", [(b"allow", b"POST, DELETE")])
    kind, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    parts = token.strip().split("_", 2)
    if kind.lower() != "bearer" or len(parts) != 3:
        return await respond(send, 401, b'{"error":"invalid_token"}', JSON)
    prefix, digest = parts[1], hashlib.sha256(token.strip().encode()).hexdigest()
    session_id = headers.get(b"mcp-session-id", b"").decode("latin-1")
    if method == "DELETE":
        return await respond(send, 200, b"", [])
    body = await read_body(receive)
    version = headers.get(b"mcp-protocol-version", b"").decode("latin-1")
    message = sdk_read(body, version) if WITH_SDK and version else json.loads(body)
    rpc = message.get("method")
    if "id" not in message:  # a notification (notifications/initialized): nothing to say
        return await respond(send, 202, b"", [])
    if rpc == "initialize":
        return await initialize(send, message, prefix, digest)
    if rpc == "tools/list":
        await upstream.get()
        return await result(send, message["id"], {"tools": [upstream.tool]}, session_id)
    if rpc == "tools/call":
        return await tools_call(send, message, prefix, digest, session_id, version)
    error = {"code": -32601, "message": f"Method not found: {rpc}"}
    return await answer(send, {"jsonrpc": "2.0", "id": message["id"], "error": error}, session_id)


JSON = [(b"content-type", b"application/json")]


async def read_body(receive: Receive) -> bytes:
    body = b""
    while True:
        event = await receive()
        body += bytes(event.get("body", b""))
        if not event.get("more_body"):
            return body


async def respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def answer(send: Send, message: dict[str, Any], session_id: str) -> None:
    await answer_json(send, json.dumps(message, separators=(",", ":")).encode(), session_id)


async def answer_json(send: Send, body: bytes, session_id: str) -> None:
    headers = [*JSON, (b"mcp-session-id", session_id.encode("latin-1"))]
    await respond(send, 200, body, headers)


async def result(send: Send, request_id: Any, value: dict[str, Any], session_id: str) -> None:
    await answer(send, {"jsonrpc": "2.0", "id": request_id, "result": value}, session_id)


async def initialize(send: Send, message: dict[str, Any], prefix: str, digest: str) -> None:
    """A new session of the token's agent: its row, its `session.started` event, its
    chain's head (one statement, one commit)."""
    external = secrets.token_hex(16)
    if GUARANTEES:
        await start_session(prefix, digest, external)
    await upstream.get()  # (opened before the session's first call)
    params = message.get("params") or {}
    value = {
        "protocolVersion": params.get("protocolVersion"),
        "capabilities": {"tools": {"listChanged": False}},
        "serverInfo": {"name": "harness-floor", "version": "0"},
    }
    await result(send, message["id"], value, external)


async def start_session(prefix: str, digest: str, external: str) -> None:
    async with pool.connection() as conn:
        row = await (await conn.execute(AGENT, (prefix, digest), prepare=True)).fetchone()
        if row is None or not hmac.compare_digest(row[3], digest):
            raise PermissionError("invalid token")
        agent_id, agent, owner = row[0], row[1], row[2]
        session = uuid.uuid4()
        chain = str(session)
        now = dt.datetime.now(dt.UTC)
        payload = {"mode": "trusted", "client": CLIENT, "external_id": external}
        values, head = event_row(
            chain, session, 1, GENESIS_HASH, "session.started", f"agent:{agent}", "", payload, now
        )
        await conn.execute(
            SESSION,
            (
                *(session, "MCP session", "trusted", "", CLIENT, external, now, now, agent_id),
                *(values[0], values[1], values[3], values[4], values[5], values[6], now),
                *(values[8], values[9]),
                *(chain, session, agent, owner, "MCP session", "trusted", now, now, head),
                sign_head(chain, 1, head),
            ),
            prepare=True,
        )


async def tools_call(
    send: Send,
    message: dict[str, Any],
    prefix: str,
    digest: str,
    session_id: str,
    version: str = "",
) -> None:
    params = message.get("params") or {}
    request_id, name = message["id"], params.get("name")
    arguments = params.get("arguments") or {}
    if name != TOOL or not isinstance(arguments, dict):
        error = {"code": -32602, "message": f"Unknown tool: {name}"}
        return await answer(send, {"jsonrpc": "2.0", "id": request_id, "error": error}, session_id)
    if not GUARANTEES:  # a bare proxy: the upstream's answer, nothing recorded
        return await result(send, request_id, (await call_upstream(arguments))[0], session_id)
    if THROUGH_DJANGO:
        return await tools_call_django(send, message, prefix, digest, session_id)
    if THROUGH_ASYNC_DJANGO:
        return await tools_call_async_django(send, message, prefix, digest, session_id, version)
    async with pool.connection() as conn:
        # 1. the token read
        row = await (
            await conn.execute(TOKEN, (prefix, digest, CLIENT, session_id), prepare=True)
        ).fetchone()
        if row is None or not hmac.compare_digest(row[2], digest):
            return await respond(send, 401, b'{"error":"invalid_token"}', JSON)
        if row[1] != "trusted":  # the decision: only a trusted session's call is allowed here
            return await not_trusted(send, request_id, session_id)
        call = Call(row[0], row[1], request_id, arguments)
        # 2. stored with its digest, decided, claimed: durable before the tool runs
        async with conn.transaction(), conn.cursor() as cur:
            await cur.execute(*call.store(), prepare=True)
            await cur.execute(*call.admitted(await locked(cur, call)), prepare=True)
    # 3. the upstream call, on the process's one session, under the call's timeout
    value, content, is_error, seconds = await call_upstream(arguments)
    # 4. the result and its event: durable before the answer
    async with pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
        await cur.execute(*call.finish(content, is_error, seconds), prepare=True)
        await cur.execute(*call.completed(await locked(cur, call)), prepare=True)
    # 5. the answer
    await result(send, request_id, value, session_id)


async def locked(cur: Any, call: Call) -> tuple[int, str]:
    """The chain head the statement just run locked (none: the write wrote nothing)."""
    return head_of(await cur.fetchone(), call)


def head_of(row: Any, call: Call) -> tuple[int, str]:
    if row is None:
        raise RuntimeError(f"call {call.call_id}: no row written, no chain head locked")
    return (row[0], row[1])


async def not_trusted(send: Send, request_id: Any, session_id: str) -> None:
    error = {"code": -32603, "message": "the floor allows trusted sessions' calls only"}
    await answer(send, {"jsonrpc": "2.0", "id": request_id, "error": error}, session_id)


async def call_upstream(arguments: dict[str, Any]) -> tuple[dict[str, Any], str, bool, float]:
    """The upstream's `echo` on the process's one session, under the call's timeout: the
    result as it came, its text, whether it is an error, and the seconds it took."""
    outcome, content, is_error, seconds = await call_upstream_typed(arguments)
    return (
        outcome.model_dump(by_alias=True, mode="json", exclude_none=True),
        content,
        is_error,
        seconds,
    )


async def call_upstream_typed(arguments: dict[str, Any]) -> tuple[Any, str, bool, float]:
    """`call_upstream` with the result as the SDK's `CallToolResult`."""
    from mcp import types

    began = asyncio.get_running_loop().time()
    try:
        session = await upstream.get()
        async with asyncio.timeout(TIMEOUT):
            outcome = await session.call_tool(UPSTREAM_TOOL, arguments)
        is_error = bool(outcome.is_error)
        content = "\n".join(c.text for c in outcome.content if getattr(c, "type", "") == "text")
    except Exception as exc:  # the call's outcome, recorded as an error
        content, is_error = f"upstream failed: {exc!r}", True
        outcome = types.CallToolResult(
            content=[types.TextContent(type="text", text=content)], is_error=True
        )
    return outcome, content, is_error, round(asyncio.get_running_loop().time() - began, 4)


# --- Hd: the same statements through Django's database layer, on threads --------------------

_threads: Any = None


def on_thread[**P, R](function: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """`function` on a pool of threads, its connection given back afterwards: Harness's
    gateway's `db` (dispatcher.gateways.mcp), restated so the floor imports no gateway."""
    from asgiref.sync import sync_to_async
    from django.db import close_old_connections

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        finally:
            close_old_connections()

    async def call(*args: P.args, **kwargs: P.kwargs) -> R:
        global _threads
        if _threads is None:
            from concurrent.futures import ThreadPoolExecutor

            _threads = ThreadPoolExecutor(32, thread_name_prefix="floor-orm")
        return await sync_to_async(run, thread_sensitive=False, executor=_threads)(*args, **kwargs)

    return call


def _read_token(prefix: str, digest: str, session_id: str) -> tuple[uuid.UUID, str] | None:
    from floor.compiled import fixed_cursor

    with fixed_cursor() as cur:
        cur.execute(TOKEN, (prefix, digest, CLIENT, session_id))
        row = cur.fetchone()
    if row is None or not hmac.compare_digest(row[2], digest):
        return None
    return row[0], row[1]


def _store_run_finish(loop: asyncio.AbstractEventLoop, call: Call) -> dict[str, Any]:
    """Steps 2 to 4 on one thread, as Harness's admission and inline run take one trip."""
    from django.db import DEFAULT_DB_ALIAS, connections, transaction

    from floor.compiled import fixed_cursor

    connection = connections[DEFAULT_DB_ALIAS]
    with transaction.atomic(), fixed_cursor() as cur:
        cur.execute(*call.store())
        cur.execute(*call.admitted(head_of(cur.fetchone(), call)))
    if getattr(connection, "pool", None) is not None:  # (given back while the tool runs)
        connection.close()
    future = asyncio.run_coroutine_threadsafe(call_upstream(call.arguments), loop)
    value, content, is_error, seconds = future.result()
    with transaction.atomic(), fixed_cursor() as cur:
        cur.execute(*call.finish(content, is_error, seconds))
        cur.execute(*call.completed(head_of(cur.fetchone(), call)))
    return value


async def tools_call_django(
    send: Send, message: dict[str, Any], prefix: str, digest: str, session_id: str
) -> None:
    params = message.get("params") or {}
    request_id, arguments = message["id"], params.get("arguments") or {}
    found = await on_thread(_read_token)(prefix, digest, session_id)
    if found is None:
        return await respond(send, 401, b'{"error":"invalid_token"}', JSON)
    if found[1] != "trusted":
        return await not_trusted(send, request_id, session_id)
    call = Call(found[0], found[1], request_id, arguments)
    value = await on_thread(_store_run_finish)(asyncio.get_running_loop(), call)
    await result(send, request_id, value, session_id)


# --- Ha: the same statements through django-async-backend, on the event loop ----------------


async def tools_call_async_django(
    send: Send,
    message: dict[str, Any],
    prefix: str,
    digest: str,
    session_id: str,
    version: str = "",
) -> None:
    """Hd's trips with no thread: the token read, then the store, the upstream call (the
    connection given back to the pool meanwhile) and the result, each statement through
    django-async-backend's connection wrapper and `async_atomic`. With the ladder's parts
    (BENCH_FLOOR_REDIS, BENCH_FLOOR_SDK) on, their work in Harness's order."""
    from django_async_backend.db import async_connections
    from django_async_backend.db.transaction import async_atomic

    params = message.get("params") or {}
    request_id, arguments = message["id"], params.get("arguments") or {}
    connection = async_connections["default"]
    # (the wait slot taken beside the token read, keyed by the token's prefix as Harness's
    # caps name an agent: its round trip hidden behind the read's; given back at once when
    # the token fails)
    taking = asyncio.ensure_future(take_slot(prefix)) if WITH_REDIS else None
    try:
        async with await connection.cursor() as cur:
            await cur.execute(TOKEN, (prefix, digest, CLIENT, session_id))
            row = await cur.fetchone()
    finally:
        await connection.close()  # (back to the pool, as Hd's threads give theirs back)
    slot = await taking if taking is not None else None
    if row is None or not hmac.compare_digest(row[2], digest) or row[1] != "trusted":
        if slot is not None:
            await redis_client().zrem(*slot)
        if row is not None and hmac.compare_digest(row[2], digest):
            return await not_trusted(send, request_id, session_id)
        return await respond(send, 401, b'{"error":"invalid_token"}', JSON)
    call = Call(row[0], row[1], request_id, arguments)
    try:
        async with async_atomic(), await connection.cursor() as cur:
            await cur.execute(*call.store())
            await cur.execute(*call.admitted(await locked(cur, call)))
    finally:
        await connection.close()
    # (no wake-up of the claim: Harness announces a running call only once its body has
    # run RUNNING_NOTICE_AFTER, 50 ms, and this one answers sooner)
    outcome, content, is_error, seconds = await call_upstream_typed(arguments)
    try:
        async with async_atomic(), await connection.cursor() as cur:
            await cur.execute(*call.finish(content, is_error, seconds))
            await cur.execute(*call.completed(await locked(cur, call)))
    finally:
        await connection.close()
    if WITH_SDK and version:
        await sdk_answer(send, request_id, outcome, session_id, version)
    else:
        value = outcome.model_dump(by_alias=True, mode="json", exclude_none=True)
        await result(send, request_id, value, session_id)
    if WITH_REDIS:  # after the answer: the result's wake-up and the slot given back, one
        # round trip off the call's way (a slot given back late makes the cap briefly
        # stricter, never looser)
        async with redis_client().pipeline(transaction=False) as pipe:
            pipe.publish(*wake_up(call, "completed"))
            if slot is not None:
                pipe.zrem(*slot)
            await pipe.execute()


# --- the ladder's parts: Harness's Redis commands, the SDK's reading and writing -------------

_redis: Any = None


def redis_client() -> Any:
    """One asyncio Redis client per process (Harness's short timeouts)."""
    global _redis
    if _redis is None:
        import redis.asyncio

        _redis = redis.asyncio.Redis.from_url(
            os.environ["REDIS_URL"], socket_timeout=2, socket_connect_timeout=2
        )
    return _redis


async def take_slot(prefix: str) -> tuple[str, str] | None:
    """One of the agent's wait slots (its token's prefix names it), with Harness's script
    and its arguments (a slot for the call's timeout, lapsing LAPSE_MARGIN later); None
    when all are held."""
    import time

    from dispatcher.limits import _RESERVE, LAPSE_MARGIN

    key, member, now = f"bench-floor:waits:{prefix}", uuid.uuid4().hex, time.time()
    # (the script's arguments: now, when the slot lapses, its member, then each key's cap;
    # 0 when taken)
    full = await redis_client().eval(
        _RESERVE, 1, key, now, now + TIMEOUT + LAPSE_MARGIN, member, 64
    )
    return None if int(full) else (key, member)


def wake_up(call: Call, status: str) -> tuple[str, str]:
    """Its channel and message (dispatcher.wakeups)."""
    from dispatcher.wakeups import session_channel

    return session_channel(str(call.session)), f"{call.call_id} {status}"


def sdk_read(body: bytes, version: str) -> dict[str, Any]:
    """The body read as Harness's fast path reads it with the SDK (a tools/call request's
    params checked for the revision and read as `CallToolRequestParams`), handed on as the
    message the floor reads."""
    import pydantic_core
    from mcp import types
    from mcp_types import methods

    data = pydantic_core.from_json(body)
    message = types.jsonrpc_message_adapter.validate_python(data, by_name=False)
    if not isinstance(message, types.JSONRPCRequest):
        return dict(data)
    if message.method != "tools/call" or not isinstance(message.params, dict):
        return {
            "jsonrpc": "2.0",
            "id": message.id,
            "method": message.method,
            "params": message.params,
        }
    methods.validate_client_request("tools/call", version, message.params)
    params = types.CallToolRequestParams.model_validate(message.params, by_name=False)
    return {
        "jsonrpc": "2.0",
        "id": message.id,
        "method": message.method,
        "params": {"name": params.name, "arguments": params.arguments},
    }


async def sdk_answer(
    send: Send, request_id: Any, outcome: Any, session_id: str, version: str
) -> None:
    """The result as Harness's fast path makes it (shaped by the SDK's runner for the
    revision, the SDK's JSON-RPC response), answered as the SDK's transport answers in its
    JSON mode (`application/json`), the cheaper of the two framings the protocol allows:
    the official client reads a JSON body to its end and keeps its connection, where it
    closes an SSE answer after its message, and reconnects for the next call. With
    BENCH_FLOOR_SSE=1, one SSE `message` event as Harness's fast path writes it."""
    from mcp import types
    from sse_starlette import EventSourceResponse, ServerSentEvent

    shaped = _runner(version)._serialize("tools/call", version, outcome)
    response = types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result=shaped)
    data = response.model_dump_json(by_alias=True, exclude_unset=True)
    if not SDK_SSE:
        return await answer_json(send, data.encode(), session_id)
    sep = EventSourceResponse.DEFAULT_SEPARATOR
    event = ServerSentEvent(data=data, event="message", sep=sep).encode()
    base = _sse_headers()
    headers = [*base[:3], (b"mcp-session-id", session_id.encode("latin-1")), *base[3:]]
    await respond(send, 200, event, headers)


_runners: dict[str, Any] = {}
_sse: list[tuple[bytes, bytes]] = []


def _sse_headers() -> list[tuple[bytes, bytes]]:
    """The SDK transport's SSE response headers, without the session's (as the fast path's)."""
    if not _sse:
        from sse_starlette import EventSourceResponse

        sdk = {
            "Cache-Control": "no-cache, no-transform",
            "Connection": "keep-alive",
            "Content-Type": "text/event-stream",
        }
        _sse.extend(EventSourceResponse(content=iter(()), headers=sdk).raw_headers)
    return _sse


def _runner(version: str) -> Any:
    """The SDK's runner for `version` (for its shaping of a result only, as the fast path's)."""
    runner = _runners.get(version)
    if runner is None:
        from mcp.server import Server
        from mcp.server.connection import Connection
        from mcp.server.runner import ServerRunner

        server: Any = Server("harness-floor")
        runner = _runners[version] = ServerRunner(
            server, Connection.from_envelope(version, None, None), {}
        )
    return runner
