"""S0f, the floor of Harness's guarantees for one auto-allowed call of a worker's tool
through the agent API (issue 37): a raw ASGI application on daphne that answers
`POST /api/v1/sessions/<id>/calls?wait=N` doing only what Harness must, and nothing else.

Per request, on one psycopg connection of a small pool (async, on the event loop, no
thread hop), prepared statements against the real tables, Harness's hash and signature
functions (bench/floor.py's `event_row`, `audit.signing.sign_head`):

1. the token read: the agent's session by the token's prefix and hash and the session id
   of the URL, agent and owner active (one SELECT);
2. one transaction: the call INSERTed with its arguments and their digest, decided and
   `queued`, with the chain head's lock in one `WITH`; its `call.received` and
   `call.allowed` events hashed into the chain and INSERTed with the signed head's UPDATE
   in one `WITH`; COMMIT (durable);
3. the worker's message pushed to the queue as Harness pushes its own (one LPUSH of
   Celery's message: floor.celery_message), the wake-up registered first on this
   process's one subscription;
4. in the worker (`bench.tasks.floor_execute`, S5f's and S6f's task): the claim and the
   result as two durable transitions with their events, then the wake-up published;
5. on the wake-up, the call read again (one SELECT) and answered 200 with its state.

No Django request handling, no policy, no guards, no tool body, no rate or wait caps: what
is left is the price of the guarantees on this stack. bench/agent_path.py runs it as S0's
third side, F, in the same samples as B and P (its own daphne, the same worker).

    daphne -b 127.0.0.1 -p PORT bench.api_floor:application
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import hmac
import json
import os
import uuid
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

import django  # noqa: E402

django.setup()  # (the audit key's settings, the models audit.services reads)

import redis.asyncio as aioredis  # noqa: E402

from audit.signing import sign_head  # noqa: E402
from bench.floor import event_row  # noqa: E402
from bench.peer_floor import _APPEND, _ROW, JSON, MODE_REASON, Pool, read_body, respond  # noqa: E402
from floor import celery_message  # noqa: E402

QUEUE = os.environ.get("BENCH_QUEUE", "harness_bench")
# BENCH_FLOOR_CHECKED=1 (S0's G): two parts of Harness's contract on top, each at its
# cheapest: the agent's wait slot taken before the store with Harness's own script
# (dispatcher.limits._RESERVE) and given back before the answer (redis-py's asyncio
# client on the loop), and the worker's re-check before the claim
# (bench.tasks.floor_execute_checked: the call's compiled read, its context, the guards).
# BENCH_FLOOR_CHECKED=lean (S0's L): the same with the leanest stage 6
# (bench.tasks.floor_execute_lean: the body on the pool child's own thread under a timer).
CHECKED = os.environ.get("BENCH_FLOOR_CHECKED") in ("1", "lean")
TASK = {
    "1": "bench.tasks.floor_execute_checked",
    "lean": "bench.tasks.floor_execute_lean",
}.get(os.environ.get("BENCH_FLOOR_CHECKED", ""), "bench.tasks.floor_execute")
MAX_WAIT = 60.0

TOKEN = (
    "SELECT s.mode, a.token_hash FROM dispatcher_agentsession s "
    "JOIN dispatcher_agent a ON a.id = s.agent_id JOIN auth_user u ON u.id = a.owner_id "
    "WHERE a.token_prefix = %s AND a.token_hash = %s AND a.is_active AND u.is_active "
    "AND s.id = %s"
)
# The call stored, decided and queued, with the head's lock (Harness's statement's shape).
STORE = (
    "WITH written AS (INSERT INTO dispatcher_toolcall (id, session_id, tool_use_id, name, "
    "raw_arguments, arguments, digest, dialect, batch_id, batch_index, batch_size, "
    "batch_all_sent, executor, status, decision, decided_by, reason, provenance, content, "
    "is_error, repeat_count, created_at, queued_at, enqueued_at, attempts, timings) VALUES "
    "(%s, %s, %s, %s, %s, %s, %s, 'native', %s, 0, 1, true, 'harness', 'queued', 'allow', "
    "%s, %s, %s, '', false, 1, %s, %s, %s, 0, '{}') RETURNING 1) "
    "SELECT last_seq, last_hash FROM audit_auditchain "
    "WHERE chain = %s AND (SELECT count(*) FROM written) > 0 FOR UPDATE"
)
APPEND_2 = _APPEND.format(rows=", ".join([_ROW] * 2))
READ = "SELECT status, content, is_error FROM dispatcher_toolcall WHERE id = %s"
# A call of the token's agent, with the token's check (S5's G: the agent's waiting request).
CALL_OF = (
    "SELECT c.status, c.content, c.is_error, a.token_hash FROM dispatcher_toolcall c "
    "JOIN dispatcher_agentsession s ON s.id = c.session_id "
    "JOIN dispatcher_agent a ON a.id = s.agent_id JOIN auth_user u ON u.id = a.owner_id "
    "WHERE c.id = %s AND a.token_prefix = %s AND a.token_hash = %s AND a.is_active "
    "AND u.is_active"
)
TERMINAL = frozenset(
    {"completed", "denied", "rejected", "cancelled", "expired", "timed_out", "outcome_unknown"}
)

pool = Pool()


class Hub:
    """This process's one subscription (to its own channel), and the calls waiting on it:
    the worker publishes "<call id> completed" there."""

    def __init__(self) -> None:
        self.channel = os.environ.get("BENCH_FLOOR_CHANNEL") or f"harness_bench:s0f:{os.getpid()}"
        self.waiting: dict[str, asyncio.Future[None]] = {}
        self.client: Any = None
        self.reader: asyncio.Task[None] | None = None

    async def ready(self) -> Any:
        if self.client is None:
            self.client = aioredis.Redis.from_url(os.environ["REDIS_URL"])
            pubsub = self.client.pubsub()
            await pubsub.subscribe(self.channel)
            await pubsub.get_message(timeout=5)  # the confirmation
            self.reader = asyncio.ensure_future(self._read(pubsub))
        return self.client

    async def _read(self, pubsub: Any) -> None:
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
            if message is None:
                continue
            call_id = message["data"].decode().split(" ")[0]
            future = self.waiting.pop(call_id, None)
            if future is not None and not future.done():
                future.set_result(None)


hub = Hub()


def task_message(call_id: str, chain: str) -> str:
    """Celery's message for `floor_execute(call_id, chain, channel)`, built as Harness
    builds its own (floor.celery_message)."""
    return celery_message.task_message(TASK, call_id, QUEUE, chain, hub.channel)


class ApiCall:
    """One call's values: its row and its two events."""

    def __init__(
        self, session: uuid.UUID, tool_use_id: str, name: str, arguments: dict[str, Any]
    ) -> None:
        self.session, self.tool_use_id, self.name = session, tool_use_id, name
        self.call_id, self.batch = uuid.uuid4(), uuid.uuid4()
        self.raw = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        self.digest = hashlib.sha256(self.raw.encode()).hexdigest()
        self.chain, self.subject = str(session), f"call:{self.call_id}"
        self.decided = {"mode": "trusted", "action": "allow", "by": "mode:trusted"}
        self.received = dt.datetime.now(dt.UTC)

    def store(self) -> tuple[str, tuple[Any, ...]]:
        self.now = now = dt.datetime.now(dt.UTC)
        return STORE, (
            *(self.call_id, self.session, self.tool_use_id, self.name, self.raw, self.raw),
            *(self.digest, self.batch, "mode:trusted", MODE_REASON),
            *(json.dumps({**self.decided, "reason": MODE_REASON}), self.received, now, now),
            self.chain,
        )

    def admitted(self, head: tuple[int, str]) -> tuple[str, list[Any]]:
        received = {
            "call_id": str(self.call_id),
            "tool_use_id": self.tool_use_id,
            "tool": self.name,
            "arguments": self.raw,
            "digest": self.digest,
            "dialect": "native",
            "batch_id": str(self.batch),
            "batch_index": 0,
        }
        allowed = {
            "call_id": str(self.call_id),
            "tool": self.name,
            **self.decided,
            "reason": MODE_REASON,
            "to": "queued",
        }
        seq, prev = head
        values: list[Any] = []
        for kind, actor, payload, at in (
            ("call.received", "agent", received, self.received),
            ("call.allowed", "mode:trusted", allowed, self.now),
        ):
            seq += 1
            row, prev = event_row(
                self.chain, self.session, seq, prev, kind, actor, self.subject, payload, at
            )
            values += row
        values += [seq, prev, self.now, sign_head(self.chain, seq, prev), 1, 1, 0, self.chain]
        return APPEND_2, values


async def take_slot(client: Any, session: uuid.UUID) -> tuple[str, str] | None:
    """One of the agent's wait slots for the request's wait (Harness's script and
    arguments: dispatcher.limits.reserve_wait), or None when all are held."""
    import time

    from dispatcher.limits import _RESERVE, LAPSE_MARGIN

    key, member, now = f"bench-floor:waits:{session}", uuid.uuid4().hex, time.time()
    # (the script's arguments: now, when the slot lapses, its member, then each key's cap;
    # 0 when taken)
    full = await client.eval(_RESERVE, 1, key, now, now + MAX_WAIT + LAPSE_MARGIN, member, 64)
    return None if int(full) else (key, member)


async def application(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    parts = scope["path"].strip("/").split("/")  # api v1 sessions <id> calls | api v1 calls <id>
    waits_on = scope["method"] == "GET" and len(parts) == 4 and parts[2] == "calls"
    if not waits_on and (scope["method"] != "POST" or len(parts) != 5 or parts[4] != "calls"):
        return await respond(send, 404, b'{"error":"not_found"}', JSON)
    headers = dict(scope["headers"])
    kind, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    fields = token.strip().split("_", 2)
    if kind.lower() != "bearer" or len(fields) != 3:
        return await respond(send, 401, b'{"error":"invalid_token"}', JSON)
    prefix, digest = fields[1], hashlib.sha256(token.strip().encode()).hexdigest()
    wait = MAX_WAIT
    for pair in scope.get("query_string", b"").decode().split("&"):
        key, _, value = pair.partition("=")
        if key == "wait":
            wait = min(float(value), MAX_WAIT)
    if waits_on:
        return await wait_for_call(send, uuid.UUID(parts[3]), prefix, digest, wait)
    session = uuid.UUID(parts[3])
    [proposed] = json.loads(await read_body(receive))["calls"]
    client = await hub.ready()
    slot = await take_slot(client, session) if CHECKED else None
    async with pool.connection() as conn:
        row = await (await conn.execute(TOKEN, (prefix, digest, session), prepare=True)).fetchone()
        if row is None or not hmac.compare_digest(row[1], digest):
            return await respond(send, 401, b'{"error":"invalid_token"}', JSON)
        if row[0] != "trusted":
            return await respond(send, 403, b'{"error":"the floor allows trusted only"}', JSON)
        call = ApiCall(session, proposed["id"], proposed["name"], proposed["arguments"])
        async with conn.transaction(), conn.cursor() as cur:
            await cur.execute(*call.store(), prepare=True)
            head = await cur.fetchone()
            if head is None:
                raise RuntimeError(f"call {call.call_id}: no chain head locked")
            await cur.execute(*call.admitted((head[0], head[1])), prepare=True)
    done = hub.waiting[str(call.call_id)] = asyncio.get_running_loop().create_future()
    await client.lpush(QUEUE, task_message(str(call.call_id), call.chain))
    try:
        await asyncio.wait_for(done, wait)
    except TimeoutError:
        hub.waiting.pop(str(call.call_id), None)
    async with pool.connection() as conn:
        status, content, is_error = await (
            await conn.execute(READ, (call.call_id,), prepare=True)
        ).fetchone()
    if slot is not None:
        await client.zrem(*slot)
    answer = {"id": str(call.call_id), "status": status, "content": content, "is_error": is_error}
    code = 200 if status == "completed" else 202
    await respond(send, code, json.dumps({"calls": [answer]}).encode(), JSON)


async def wait_for_call(
    send: Any, call_id: uuid.UUID, prefix: str, digest: str, wait: float
) -> None:
    """`GET /api/v1/calls/<id>?wait=N` (S5's G: the agent waiting for its call): the wake-up
    registered, the call read with the token's check, then, unless it is done, the
    wake-up awaited and the call read again; answered with its state."""
    client = await hub.ready()
    key = str(call_id)
    done = hub.waiting[key] = asyncio.get_running_loop().create_future()
    async with pool.connection() as conn:
        row = await (
            await conn.execute(CALL_OF, (call_id, prefix, digest), prepare=True)
        ).fetchone()
    if row is None or not hmac.compare_digest(row[3], digest):
        hub.waiting.pop(key, None)
        return await respond(send, 404, b'{"error":"not_found"}', JSON)
    status, content, is_error = row[0], row[1], row[2]
    if status not in TERMINAL:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done, wait)
        async with pool.connection() as conn:
            status, content, is_error = await (
                await conn.execute(READ, (call_id,), prepare=True)
            ).fetchone()
    hub.waiting.pop(key, None)
    del client
    answer = {"id": key, "status": status, "content": content, "is_error": is_error}
    await respond(send, 200 if status in TERMINAL else 202, json.dumps(answer).encode(), JSON)
