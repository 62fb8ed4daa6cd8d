"""Red-team of dcc51fe: an inline call of an upstream HTTP MCP server's tool is admitted
and claimed on one ORM trip (mcp.admit, on_loop), its body awaited on the request's own
loop (mcp.run_pending: execution.run_body_async, pipeline.execute_async, upstream.Pool.
call_async), its result written on a second ORM trip (mcp.finish), all of it a task of its
own kept in mcp._admitting under asyncio.shield. Each test is an attack, driven through the
real gateway (/mcp/) on the in-process serving loop of test_inline_loop_attacks (one loop
in a thread, as daphne's) against the hostile upstream process; it passes when the attack
fails: the call runs once and its result is stored, the request's wait slot is given back
exactly once whenever the request goes, the per-agent cap holds on the loop lane, nothing
is left behind (tasks, threads, sockets, database connections), a deployment's execute
wrapper sees every call it ran, a changed definition is noted off the loop and the call
not sent, and the loop is never blocked.

Two defects found on its path (not in code dcc51fe changed), each test failing before its
fix: a Redis that stops answering hung the finish trip's result wake-up for ever
(floor.redis_clients.redis_at had no socket timeout: the request was never answered, its
slot never given back, its ORM thread held); and two calls awaiting one session that
failed to start crashed the second with KeyError(Endpoint) (upstream.Pool._connection's
`del`), whose text, the endpoint's repr with its headers, reached the agent and the audit:
the upstream server's credentials leaked. Fixed: the client's timeouts; each call removes
only its own failed session; an Endpoint's repr leaves out its headers and environment;
and a crash's message names the exception's type, never its text."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection as default_connection
from django.db.models import F

from audit import kinds
from audit.models import AuditEvent
from dispatcher import execution, limits, pipeline
from dispatcher.gateways import mcp
from dispatcher.gateways.mcp import TOO_MANY_WAITS
from dispatcher.models import Status, ToolCall
from dispatcher.tools.base import ExecutionContext, Tool
from dispatcher.tools.sources import services, upstream
from dispatcher.tools.sources.models import McpServer, McpTool, ToolState
from dispatcher.tools.sources.upstream import messages_changed
from tests.mcp.test_fast_path import call
from tests.redteam import test_inline_loop_attacks as loop_attacks
from tests.redteam.test_inline_loop_attacks import (
    DB_MARGIN,
    TIMEOUT,
    Hostile,
    ServingLoop,
    register,
    result_of,
    stored,
)
from tests.support.factories import make_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]

hostile = loop_attacks.hostile  # (a hostile upstream server process, loopback)
serving = loop_attacks.serving  # (one serving loop in a thread, as daphne's)

TERMINAL = (Status.COMPLETED, Status.TIMED_OUT, Status.OUTCOME_UNKNOWN)


def text(result: dict[str, Any]) -> str:
    return " ".join(block.get("text", "") for block in result["content"])


def until(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def settled(row: ToolCall, seconds: float) -> ToolCall:
    deadline = time.monotonic() + seconds
    while row.status not in TERMINAL:
        assert time.monotonic() < deadline, row.status
        time.sleep(0.05)
        row.refresh_from_db()
    return row


@pytest.fixture
def releases(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every wait slot given back (limits.release_wait, read at each call: the admission's
    trip, the finish trip and the ending request all find it here)."""
    given: list[str] = []
    real = limits.release_wait

    def counting(slot: str) -> None:
        given.append(slot)
        real(slot)

    monkeypatch.setattr(limits, "release_wait", counting)
    yield given


def nothing_admitting(seconds: float = 5.0) -> None:
    until(lambda: not mcp._admitting, seconds, f"admissions left: {len(mcp._admitting)}")


# --- 1. The request goes at each phase: admission trip, body, finish trip ------------------


@pytest.mark.parametrize("how", ["hangs_up", "is_cancelled"])
@pytest.mark.parametrize("phase", ["admission", "body", "finish"])
def test_a_request_gone_at_each_phase_runs_once_and_gives_its_slot_back_once(
    hostile: Hostile,
    serving: ServingLoop,
    releases: list[str],
    monkeypatch: pytest.MonkeyPatch,
    phase: str,
    how: str,
) -> None:
    """The client hangs up (http.disconnect), or the request's task is cancelled outright
    (daphne, past application_close_timeout), while its call is on its admission's ORM
    trip (claimed, not yet run), while its body is awaited on the loop, or while its
    result is being written on the finish trip. Each time: the call is sent once, its
    result stored (completed, attempt 1), the agent's slot given back exactly once (none
    held after), and the admission task leaves mcp._admitting."""
    name = register(hostile.url)
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    reached = threading.Event()
    if phase == "admission":
        real_admit = mcp.admit

        def slow_admit(*args: Any, **kwargs: Any) -> Any:
            answer = real_admit(*args, **kwargs)  # admitted and claimed...
            reached.set()
            time.sleep(0.6)  # ...and the trip not back yet when the request goes
            return answer

        monkeypatch.setattr(mcp, "admit", slow_admit)
    elif phase == "finish":
        real_record = execution.record_result

        def slow_record(*args: Any, **kwargs: Any) -> None:
            reached.set()
            time.sleep(0.6)  # the body has run; the request goes before it is written
            real_record(*args, **kwargs)

        monkeypatch.setattr(execution, "record_result", slow_record)
    started = time.monotonic()
    request = serving.post(fx, call(1, f"{name}__sleep", {"seconds": 0.3}), session)
    if phase == "body":
        until(lambda: bool(hostile.calls()), 10, "the call did not reach the server")
        # (the claim was durable, with its events, before the server saw the call)
        sent = stored(session, f"{name}__sleep")
        assert sent.status == Status.RUNNING, sent.status
        assert list(
            AuditEvent.objects.filter(subject=f"call:{sent.pk}")
            .order_by("id")
            .values_list("kind", flat=True)
        ) == ["call.received", "call.allowed", "call.started"]
    else:
        assert reached.wait(10), f"the {phase} phase was not reached"
    assert limits.waits_held(fx.agent) == 1
    request.hang_up() if how == "hangs_up" else request.cancel()
    row = settled(stored(session, f"{name}__sleep"), TIMEOUT + 1 + DB_MARGIN)
    assert time.monotonic() - started < TIMEOUT + 1 + DB_MARGIN
    assert (row.status, row.content, row.attempts) == (Status.COMPLETED, "slept 0.3", 1)
    nothing_admitting()
    until(lambda: limits.waits_held(fx.agent) == 0, 5, "the slot was never given back")
    time.sleep(0.3)  # (a second give-back would have come by now)
    assert len(releases) == 1, releases
    assert [line.split()[0] for line in hostile.calls()] == ["sleep"], hostile.calls()
    kinds_ = list(
        AuditEvent.objects.filter(subject=f"call:{row.pk}").order_by("id").values_list("kind")
    )
    assert [k for (k,) in kinds_] == [
        "call.received",
        "call.allowed",
        "call.started",
        "call.completed",
    ], kinds_


# --- 2. The same request id while the first is on the loop ---------------------------------


def test_the_same_id_sent_while_the_first_body_is_on_the_loop_runs_once(
    hostile: Hostile, serving: ServingLoop, releases: list[str]
) -> None:
    """The same tools/call (same request id, same session) sent three more times while the
    first one's body is awaited on the loop: one call, sent once; every request answered
    with its result; four slots taken, four given back, none held after. (The body is
    held by the server until the four slots are taken, not trusted to last 0.8 s: on a
    loaded host the three could come after it.)"""
    name = register(hostile.url, timeout=60.0)
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    body = call(5, f"{name}__sleep", {"seconds": 0.1})
    hold = Path(f"{hostile.calls_file}.sleep-hold")
    hold.touch()
    try:
        first = serving.post(fx, body, session)
        until(lambda: bool(hostile.calls()), 30, "the call did not reach the server")
        again = [serving.post(fx, body, session) for _ in range(3)]
        until(lambda: limits.waits_held(fx.agent) == 4, 30, "the three did not take slots")
        assert not first.future.done()  # (all four in while the first body is awaited)
    finally:
        hold.unlink()
    answers = [result_of(r.result(30)) for r in (first, *again)]
    assert [text(a) for a in answers] == ["slept 0.1"] * 4, answers
    assert ToolCall.objects.filter(name=f"{name}__sleep").count() == 1
    assert stored(session, f"{name}__sleep").attempts == 1
    nothing_admitting()
    until(lambda: limits.waits_held(fx.agent) == 0, 5, "a slot was never given back")
    assert len(releases) == 4 and len(set(releases)) == 4, releases
    assert [line.split()[0] for line in hostile.calls()] == ["sleep"], hostile.calls()


# --- 3. Many agents' hung calls: the cap holds, bystanders are served, nothing is left -----


def _socket_peers() -> dict[int, int]:
    """How many of the process's TCP sockets are connected to each remote port."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    peers: dict[int, int] = {}
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[9] in inodes and fields[3] == "01":  # ESTABLISHED
                    port = int(fields[2].rsplit(":", 1)[1], 16)
                    peers[port] = peers.get(port, 0) + 1
    return peers


def _thread_names() -> set[str]:
    """The process's threads but its pools' (ORM threads, executors: bounded, reused)."""
    pools = ("mcp-orm", "ThreadPoolExecutor", "asyncio_", "outbound-resolve")
    return {t.name for t in threading.enumerate() if not t.name.startswith(pools)}


def _db_backends() -> int:
    """PostgreSQL's backends of this database (0 elsewhere: SQLite has no server)."""
    if default_connection.vendor != "postgresql":
        return 0
    with default_connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def test_hung_calls_of_many_agents_keep_the_cap_and_leave_nothing_behind(
    hostile: Hostile, serving: ServingLoop, settings: Any
) -> None:
    """Three agents send eight calls each (their cap) of a server that never answers: 24
    bodies awaited on the loop at once, none holding a thread. Meanwhile: a ninth call of
    one of them is refused (too many waits, nothing recorded) although no thread is held;
    a bystander's call of another server is answered at once; the loop is never stalled.
    Afterwards every call has timed out once, every slot is back, and nothing the 24 used
    is left: no admission task, no notice thread, no socket, no database connection
    beyond what was there before (the loop lane must not grow without bound)."""
    hang = 8.0  # (the hung calls' timeout: the checks below happen while they all wait)
    name = register(hostile.url, timeout=hang)
    other = register(hostile.url)
    agents = [make_agent(mode="trusted") for _ in range(3)]
    sessions = [serving.session(fx) for fx in agents]
    bystander = make_agent(mode="trusted")
    bystander_session = serving.session(bystander)
    # (warm: the other server's session exists, so the baseline counts its socket)
    warm = serving.post(bystander, call(1, f"{other}__echo", {"text": "w"}), bystander_session)
    assert text(result_of(warm.result(30))) == "echo: w"
    threads, peers_before = _thread_names(), _socket_peers()
    done = serving.watch()
    try:
        started = time.monotonic()
        held = [
            serving.post(fx, call(10 + i, f"{name}__never", {}), s)
            for fx, s in zip(agents, sessions, strict=True)
            for i in range(8)
        ]
        running = ToolCall.objects.filter(name=f"{name}__never", status=Status.RUNNING)
        until(lambda: running.count() == 24, hang / 2, "not all 24 running at once")
        assert len(mcp._admitting) == 24, len(mcp._admitting)

        # (24 calls hung on their server: no ORM thread held; the last admissions' trips
        # may still be ending, e.g. handing back their connection, so this is awaited)
        def orm_busy() -> list[str]:
            return [t for t in _threads_in("thread_handler") if t.startswith("mcp-orm")]

        until(lambda: orm_busy() == [], hang / 2, f"ORM threads held: {orm_busy()}")
        ninth = serving.post(agents[0], call(99, f"{other}__echo", {"text": "9"}), sessions[0])
        [message] = ninth.result(30).messages()
        quick_started = time.monotonic()
        echo = serving.post(
            bystander, call(2, f"{other}__echo", {"text": "b"}), bystander_session
        ).result(30)
        quick_took = time.monotonic() - quick_started
        meanwhile = [r for r in held if r.future.done()]
        answers = [result_of(r.result(30)) for r in held]
        took = time.monotonic() - started
    finally:
        done.set()
    assert message.get("error", {}).get("code") == TOO_MANY_WAITS, message
    assert not ToolCall.objects.filter(name=f"{other}__echo", tool_use_id__endswith=":99").exists()
    # (answered while all 24 still wait: `meanwhile`; the bound only catches a stall)
    assert text(result_of(echo)) == "echo: b" and quick_took < hang / 2, (echo, quick_took)
    assert meanwhile == [], len(meanwhile)
    assert all("did not finish within" in text(a) for a in answers), {text(a) for a in answers}
    assert took < hang + 1 + DB_MARGIN, took
    # (a loop blocked on a hung body would lag by its timeout, 8 s; a loaded host's
    # stalls of the thread, a second or more, are not that)
    assert serving.lag < hang / 2, serving.lag
    statuses = set(ToolCall.objects.filter(name=f"{name}__never").values_list("status", "attempts"))
    assert statuses == {(Status.TIMED_OUT, 1)}, statuses
    nothing_admitting()
    until(lambda: all(limits.waits_held(fx.agent) == 0 for fx in agents), 5, "slots held")
    left = _thread_names() - threads
    until(lambda: not _thread_names() - threads, 5, f"threads left: {left}")
    # Sockets: to the upstream, the other server's session and the one that replaced the
    # timed-out session (the hung ones closed once the last of the 24 ended); to PostgreSQL, no more than its pool
    # keeps; to Redis, no more than one per request that was open at once.
    upstream_port = int(hostile.url.rsplit(":", 1)[1].split("/")[0])
    pool_max = settings.DATABASES["default"].get("OPTIONS", {}).get("pool", {}).get("max_size", 0)

    def bounded() -> bool:
        peers = _socket_peers()
        return (
            peers.get(upstream_port, 0) <= peers_before.get(upstream_port, 0) + 1
            and peers.get(5432, 0) <= max(pool_max, peers_before.get(5432, 0) + 2)
            and peers.get(6379, 0) <= peers_before.get(6379, 0) + 24 + 2
        )

    until(bounded, 8, f"sockets left: {_socket_peers()} (before: {peers_before})")
    nevers = [line for line in hostile.calls() if line.startswith("never ")]
    # (one session, each call its own request in flight on it: each sent once, at once)
    assert len(nevers) == 24, hostile.calls()


# --- 4. A deployment's execute wrapper sees every call it ran ------------------------------

wrapped: list[tuple[str, str]] = []


def recording_wrapper(tool: Tool, ctx: ExecutionContext, arguments: dict[str, Any]) -> Any:
    """A deployment's HARNESS_EXECUTE_WRAPPER: notes each call (and the thread it is on),
    then runs it."""
    wrapped.append((ctx.call_id, threading.current_thread().name))
    return tool.execute(ctx, arguments)


def test_every_call_run_under_a_custom_execute_wrapper_goes_through_it(
    hostile: Hostile, serving: ServingLoop, settings: Any
) -> None:
    """With a deployment's execute wrapper set, no inline call takes the loop lane (which
    would skip it): each call that reached the server (a result, a broken answer, a
    timeout) went through the wrapper, never on the serving loop's thread, and the loop
    kept running meanwhile (the wrapped body holds its ORM thread, not the loop): while
    the server holds the sleep, the loop runs a callback and the sleep is not answered."""
    settings.HARNESS_EXECUTE_WRAPPER = f"{__name__}.recording_wrapper"
    wrapped.clear()
    name = register(hostile.url, timeout=60.0)
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    hold = Path(f"{hostile.calls_file}.sleep-hold")
    hold.touch()
    try:
        answers = {
            tool: serving.post(fx, call(i, f"{name}__{tool}", args), session)
            for i, (tool, args) in enumerate(
                [("echo", {"text": "w"}), ("garbage", {}), ("sleep", {"seconds": 0.1})]
            )
        }
        until(lambda: "sleep" in {c.split()[0] for c in hostile.calls()}, 30, "no sleep sent")
        # (a body awaited on the loop would hold it as long as the server holds the sleep)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), serving.loop).result(30)
        assert not answers["sleep"].future.done()
    finally:
        hold.unlink()
    results = {tool: result_of(r.result(30)) for tool, r in answers.items()}
    assert text(results["echo"]) == "echo: w" and results["garbage"]["isError"] is True
    assert text(results["sleep"]) == "slept 0.1"
    ran = {str(stored(session, f"{name}__{tool}").pk) for tool in answers}
    assert {call_id for call_id, _ in wrapped} == ran, (wrapped, ran)
    assert len(wrapped) == 3 and all(thread != "serving" for _, thread in wrapped), wrapped
    assert sorted(line.split()[0] for line in hostile.calls()) == ["echo", "garbage", "sleep"]
    nothing_admitting()
    until(lambda: limits.waits_held(fx.agent) == 0, 5, "a slot was never given back")


# --- 5. A definition changed upstream, seen by a call on the loop --------------------------


def test_a_changed_definition_seen_on_the_loop_is_noted_off_it_and_the_call_not_sent(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """The pinned definition of a tool no longer matches what the server lists (here the
    pin moved; the server's session is already open on the serving loop, its listing
    kept): the call on the loop is not sent, the tool is held as changed with its audit
    event (written on a thread: never the ORM on the loop), the model reads why, the slot
    is back and the database connection of that thread is not left open."""
    name = register(hostile.url)
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    first = serving.post(fx, call(1, f"{name}__echo", {"text": "one"}), session)
    assert text(result_of(first.result(30))) == "echo: one"  # (the session is open)
    backends = _db_backends()
    McpTool.objects.filter(server__name=name, name="echo").update(fingerprint="0" * 64)
    services._bump_generation()
    done = serving.watch()
    try:
        second = result_of(
            serving.post(fx, call(2, f"{name}__echo", {"text": "two"}), session).result(30)
        )
    finally:
        done.set()
    assert second["isError"] is True, second
    assert text(second).startswith(messages_changed(name, "echo")), second
    row = McpTool.objects.get(server__name=name, name="echo")
    assert row.state == ToolState.CHANGED, row.state
    assert AuditEvent.objects.filter(kind=kinds.MCP_TOOL_CHANGED).exists()
    rows = ToolCall.objects.filter(name=f"{name}__echo").order_by("created_at")
    assert [(r.status, r.is_error, r.attempts) for r in rows] == [
        (Status.COMPLETED, False, 1),
        (Status.COMPLETED, True, 1),
    ]
    assert [line.split()[0] for line in hostile.calls()] == ["echo"], hostile.calls()
    # (the ORM on the loop refuses to run, so the event above would be missing; this bound
    # is for a loop blocked by seconds, not a loaded host's stall of the thread, which
    # reaches a second)
    assert serving.lag < TIMEOUT * 1.25, serving.lag
    nothing_admitting()
    until(lambda: limits.waits_held(fx.agent) == 0, 5, "a slot was never given back")
    until(lambda: _db_backends() <= backends + 1, 5, "the noting thread's connection left open")


# --- 6. A Redis that stops answering while the call runs -----------------------------------


class Blackhole:
    """A TCP server that accepts every connection and reads, and never answers (a Redis
    that stopped: SIGSTOP, a full disk's fsync, a dropped route with the socket open)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, name="blackhole", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        """Every connection reset: whatever waits on one is let go."""
        self.server.close()
        for conn in self.accepted:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


@pytest.fixture
def blackhole() -> Iterator[Blackhole]:
    hole = Blackhole()
    try:
        yield hole
    finally:
        hole.close()


def test_a_redis_that_stops_answering_mid_call_does_not_hang_the_request(
    hostile: Hostile, serving: ServingLoop, settings: Any, blackhole: Blackhole
) -> None:
    """Redis stops answering (it accepts, reads, never replies) after the session was
    opened: the call's wait slot falls back to this process's count (limits: 2 s timeout),
    its body runs on the loop past RUNNING_NOTICE_AFTER (the running notice, on a thread
    of its own, hangs: the body goes on after NOTICE_JOIN), its result is written. The
    request must then be answered with that result in bounded time, and its finish trip
    must not hold an ORM thread for ever on the result's wake-up."""
    name = register(hostile.url)
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    settings.REDIS_URL = f"redis://127.0.0.1:{blackhole.port}/11"
    started = time.monotonic()
    request = serving.post(fx, call(1, f"{name}__sleep", {"seconds": 0.3}), session)
    recorded = ToolCall.objects.filter(name=f"{name}__sleep")
    until(recorded.exists, 10, "the call was never recorded")
    row = settled(stored(session, f"{name}__sleep"), TIMEOUT + 1 + DB_MARGIN + 4)
    assert (row.status, row.content) == (Status.COMPLETED, "slept 0.3")
    # (the slot's Redis timeout, its release's, NOTICE_JOIN, and a loaded host's database
    # trips: at load 12 the answer once came past 8 s; a hung publish holds it for ever,
    # and is named by the threads still in it)
    bound = 2 + 2 + 1 + 3 * DB_MARGIN
    try:
        answer = request.result(max(0.1, bound - (time.monotonic() - started)))
    except concurrent.futures.TimeoutError:
        answer = None
    publishing = _threads_in("publish_change")
    blackhole.close()  # (lets go of whatever hangs on it)
    assert answer is not None and not publishing, (
        f"no answer {bound:g} s after the call's result was stored (Redis unresponsive): "
        f"threads hung publishing a wake-up: {publishing}"
    )
    assert text(result_of(answer)) == "slept 0.3"


def _threads_in(function: str) -> list[str]:
    """The threads whose stack is in `function` now."""
    names = {t.ident: t.name for t in threading.enumerate()}
    hung = []
    for ident, frame in sys._current_frames().items():
        at: Any = frame
        while at is not None:
            if at.f_code.co_name == function:
                hung.append(names.get(ident, str(ident)))
                break
            at = at.f_back
    return hung


# --- 7. A session that fails to start, awaited by two calls at once -------------------------


class SlowCloser:
    """A TCP server that accepts each connection, and closes it half a second later
    without a byte (an upstream that went down: its session cannot start)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, name="slow-closer", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Timer(0.5, conn.close).start()

    def close(self) -> None:
        self.server.close()


def test_two_calls_awaiting_a_session_that_fails_to_start_leak_no_secret(
    hostile: Hostile, serving: ServingLoop, settings: Any
) -> None:
    """A server with a credential header goes down (its address accepts and then closes:
    the session cannot start). Two calls of it arrive at once, both awaiting the one
    connection being opened on the loop. Both fail closed with the server's error, and
    neither the answer, the stored call nor its audit carries the credential (an internal
    error's text may name the endpoint, whose repr holds its headers)."""
    secret = "s3cr3t-upstream-token-" + uuid.uuid4().hex[:8]
    name = register(hostile.url, "--header", f"X-Api-Key={secret}")
    closer = SlowCloser()
    try:
        settings.HARNESS_OUTBOUND_ALLOW = [
            *settings.HARNESS_OUTBOUND_ALLOW,
            f"127.0.0.1:{closer.port}",
        ]
        McpServer.objects.filter(name=name).update(
            url=f"http://127.0.0.1:{closer.port}/mcp", version=F("version") + 1
        )
        services._bump_generation()
        a, b = make_agent(mode="trusted"), make_agent(mode="trusted")
        sessions = [serving.session(fx) for fx in (a, b)]
        requests = [
            serving.post(fx, call(1, f"{name}__echo", {"text": "x"}), s)
            for fx, s in zip((a, b), sessions, strict=True)
        ]
        answers = [result_of(r.result(30)) for r in requests]
    finally:
        closer.close()
    rows = list(ToolCall.objects.filter(name=f"{name}__echo"))
    events = AuditEvent.objects.filter(subject__in=[f"call:{row.pk}" for row in rows])
    leaked = [
        where
        for where, content in [
            *((f"answer {i}", text(answer)) for i, answer in enumerate(answers)),
            *((f"call {row.pk}", row.content) for row in rows),
            *((f"event {e.kind}", json.dumps(e.payload)) for e in events),
        ]
        if secret in content
    ]
    assert leaked == [], (leaked, [text(answer) for answer in answers])
    assert all(answer["isError"] for answer in answers), answers
    assert all("internal error" not in text(answer) for answer in answers), answers
    assert hostile.calls() == []


# --- 8. A body that swallows its backstop's cancellation ------------------------------------


def test_a_call_after_a_configuration_change_waits_for_no_old_session(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """A's call opens the server's session, whose start hangs (initialize answered 5 s
    later). The server is registered again with another header; B's call then retires the
    old session (upstream.Pool._connection) without waiting for it to close (before, it
    closed it first and waited up to 5 s, and B's backstop cancelled it there: once, that
    cancellation was swallowed and the body went on to a new session). B is sent on a new
    session with the new header and answered at once; A is answered as timed out at its
    backstop and never sent afterwards (its deadline is checked before it is sent); no
    admission is left."""
    name = "h" + uuid.uuid4().hex[:8]
    loop_attacks.register_as(name, hostile.url, "--header", "X-Probe=old")
    delay = Path(f"{hostile.calls_file}.initialize-delay")
    delay.write_text("5")
    Path(f"{hostile.calls_file}.initialize-log").write_text("")  # (initializes logged)
    a, b = make_agent(mode="trusted"), make_agent(mode="trusted")
    sessions = [serving.session(fx) for fx in (a, b)]
    started = time.monotonic()
    first = serving.post(a, call(1, f"{name}__probe", {}), sessions[0])
    # A's initialize has reached the server, which holds it (a fixed 0.3 s, on a loaded
    # host, was once over before A's call reached the server: its start was not held;
    # and the server has read the delay file, not a fixed 0.3 s after its note)
    held = Path(f"{hostile.calls_file}.initialize-held")
    until(held.exists, 30, "A's initialize was never held by the server")
    delay.unlink()
    services.remove_server(name=name, actor="rtloop")
    loop_attacks.register_as(name, hostile.url, "--header", "X-Probe=new")
    b_started = time.monotonic()
    second = serving.post(b, call(1, f"{name}__probe", {}), sessions[1])
    b_answer = result_of(second.result(30))
    b_took = time.monotonic() - b_started
    a_answer = result_of(first.result(30))
    answered = time.time()
    assert "did not finish within" in text(a_answer), a_answer
    assert (text(b_answer), b_answer["isError"]) == ("new", False), b_answer
    # (at once: not after the old session's 5 s start, which B's backstop, TIMEOUT + 1,
    # would have cut with an error instead of "new"; not the 2 s of a loaded host's trips)
    assert b_took < TIMEOUT + 1, b_took
    # (the old session's start has ended by now, and a new one had all the time it needs)
    time.sleep(max(0.0, started + 5 + 1.5 - time.monotonic()))
    calls = [line for line in hostile.calls() if not line.startswith("initialize")]
    late = [line for line in calls if float(line.split()[1]) >= answered]
    assert late == [] and [line.split()[0] for line in calls] == ["probe"], calls
    nothing_admitting()
    statuses = {
        row.session.external_id: row.status
        for row in ToolCall.objects.filter(name=f"{name}__probe").select_related("session")
    }
    assert sorted(statuses.values()) == sorted([Status.TIMED_OUT, Status.COMPLETED]), statuses


def test_a_crash_or_a_servers_configuration_never_carries_its_secrets_to_the_model() -> None:
    """Whatever a body crashes with, the model (and the call's stored content, and its
    audit event) reads the exception's type only; and a server's configuration, quoted by
    an exception's text, leaves out its headers and environment."""
    endpoint = upstream.Endpoint(
        server_id=1,
        version=1,
        name="s",
        transport="http",
        url="http://127.0.0.1:9/mcp/s3cr3t-path?key=s3cr3t-query",
        headers=(("X-Api-Key", "s3cr3t-header"),),
        env=(("TOKEN", "s3cr3t-env"),),
    )
    assert "s3cr3t" not in repr(endpoint) and "s3cr3t" not in str(KeyError(endpoint))
    # A failure's account quoting the request (an HTTP error names its URL, a server may
    # echo a header) reaches the model without them.
    quoted = upstream.UpstreamError(
        f"Client error '401 Unauthorized' for url '{endpoint.url}' (sent s3cr3t-header)"
    )
    context = ExecutionContext(
        workspace=Path("/"), call_id="c", timeout=1, output_limit=10_000, raw_arguments="{}"
    )
    told = str(upstream._could_not_run(endpoint, "t", quoted, context))
    assert "s3cr3t" not in told and "401 Unauthorized" in told, told
    tool = Tool(name="t", description="d", parameters={"type": "object"})
    content, is_error = pipeline.project_content(
        tool, pipeline.Outcome(error=RuntimeError("password=s3cr3t-text"))
    )
    assert is_error and "s3cr3t" not in content and "RuntimeError" in content, content
