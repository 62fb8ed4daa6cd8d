"""Red-team of two changes to the upstream session pool (dispatcher/tools/sources/upstream.py):
a session of a server whose configuration changed is retired (it takes no new call, and is
closed in the background once its last call in flight ends) rather than awaited closed
(`Pool._connection`); and a call's `session.call_tool` is bounded by `asyncio.timeout` from
its start (`Pool._call_on`), so that a request still waiting for the SDK's sender when its
time is up is not sent. Each test is an attack, driven through the real gateway (/mcp/) on
an in-process serving loop or through the pool's two lanes (`Pool.call_async` on the
serving loop, `Pool.call` from a thread onto the pool's own loop, as a worker's), against
the hostile upstream process (tests/support/mcp_hostile_upstream.py); it passes when the
attack fails.

Two defects found and fixed with them. A call that waited for a session (starting, or a
stdio server's turn) when a call of the server's new configuration retired it took the
retired session for broken and opened a new session of the OLD configuration (its URL and
headers, a stdio server's command and environment) after the change, retiring the new
configuration's session for it: it is now not sent (upstream.SUPERSEDED). And a removed
server's session (a stdio server's sandboxed process) stayed open in every process that
had used it, until the process ended or a server of its name was registered again: the
catalog's rebuild now retires the sessions of configurations no longer offered
(upstream.Pool.keep_only).

Held: a request held behind the SDK's sender (a cancel notice the server holds) is
answered timed out at its timeout on both lanes and never sent afterwards (the body itself
ends up to the SDK's _ABANDON_WRITE_TIMEOUT, 5 s, later: it writes the notice cancelling the
request it was writing through the held sender; the host does not wait for it); the bound's
TimeoutError is told apart from a socket's; a stdio call cut by the bound stops its process;
a session retired while it starts, twice, is closed once started."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import sys
import threading
import time
import uuid
from io import StringIO
from pathlib import Path
from typing import Any, cast

import psutil
import pytest
from django.core.management import call_command

from dispatcher import pipeline
from dispatcher.models import Status
from dispatcher.tools.base import ExecutionContext
from dispatcher.tools.sources import catalog, services
from dispatcher.tools.sources import upstream as upstream_module
from tests.mcp.test_fast_path import call
from tests.redteam import test_inline_loop_attacks as loop_attacks
from tests.redteam.test_concurrent_session_attacks import text
from tests.redteam.test_inline_loop_attacks import (
    DB_MARGIN,
    Hostile,
    ServingLoop,
    register,
    register_as,
    result_of,
    stored,
    until_sent,
)
from tests.support.factories import make_agent
from tests.support.paths import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]

hostile = loop_attacks.hostile  # (a hostile upstream server process, loopback)
serving = loop_attacks.serving  # (one event loop serving every request, as daphne's)


def lines(hostile: Hostile, what: str) -> list[tuple[float, dict[str, Any]]]:
    found = []
    for line in hostile.calls():
        kind, at, arguments = line.split(" ", 2)
        if kind == what:
            found.append((float(at), json.loads(arguments)))
    return found


def target(name: str, tool: str) -> tuple[upstream_module.Endpoint, str]:
    """The endpoint and pinned fingerprint the catalog calls `tool` of server `name` with."""
    found = catalog.upstream_tool(f"{name}__{tool}")
    assert found is not None
    # (functools.partial(services.run_tool, endpoint, tool, fingerprint))
    endpoint, _tool, fingerprint = cast(functools.partial[Any], found.execute).args
    return endpoint, fingerprint


def connections_of(loop: asyncio.AbstractEventLoop, name: str) -> list[upstream_module.Connection]:
    kept = upstream_module.POOL._connections.get(loop, {})
    return [c for e, c in list(kept.items()) if e.name == name]


def until_sessions(loop: asyncio.AbstractEventLoop, name: str, count: int) -> int:
    """Until at most `count` session tasks of server `name` run on `loop` (8 s): how many."""

    async def running() -> int:
        tasks = asyncio.all_tasks()
        return sum(1 for t in tasks if t.get_name() == f"mcp-{name}" and not t.done())

    deadline = time.monotonic() + 8
    while True:
        now = asyncio.run_coroutine_threadsafe(running(), loop).result(10)
        if now <= count or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


# --- A configuration change while a call waits for its session ----------------------------


def test_a_call_waiting_for_its_session_when_the_configuration_changes_never_reopens_the_old(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """Agent A's call waits for its server's session to start (slow: 2.5 s) when an admin
    registers the server again with another header, and agent B calls it. The session A
    waited for is retired under it; A's call must not open another session with the old
    header after B's has opened with the new (the old credentials used again after the
    change, and B's new session retired under B, ping-pong), nor be answered as completed:
    it fails closed (not sent) or is served on its own old session; B's is made with the
    new header."""
    calls_file = hostile.calls_file
    name = register(hostile.url, "--header", "X-Probe=old", timeout=10.0)
    Path(f"{calls_file}.initialize-log").write_text("")
    delay = Path(f"{calls_file}.initialize-delay")
    delay.write_text("2.5")
    a, b = make_agent(mode="trusted"), make_agent(mode="trusted")
    session_a, session_b = serving.session(a), serving.session(b)
    first = serving.post(a, call(1, f"{name}__probe", {"who": "a"}), session_a)
    until_sent(hostile, "initialize")
    delay.unlink()
    services.remove_server(name=name, actor="rtretire")
    register_as(name, hostile.url, "--header", "X-Probe=new", timeout=10.0)
    changed_at = time.time()
    delay.write_text("2.5")
    second = serving.post(b, call(1, f"{name}__probe", {"who": "b"}), session_b)
    got_b = result_of(second.result(60))
    got_a = result_of(first.result(60))
    assert (got_b["isError"], text(got_b)) == (False, "new"), got_b
    reopened = [at for at, probe in lines(hostile, "initialize") if probe["probe"] == "old"]
    assert [at for at in reopened if at > changed_at] == [], (changed_at, hostile.calls())
    old_probes = [at for at, who in lines(hostile, "probe") if who == {"who": "a"}]
    if got_a["isError"]:
        assert old_probes == [], hostile.calls()
        assert "configuration changed" in text(got_a) and "not sent" in text(got_a), got_a
        assert "X-Probe" not in text(got_a) and hostile.url not in text(got_a)
    else:
        assert text(got_a) == "old" and len(old_probes) == 1
        assert stored(session_a, f"{name}__probe").status == Status.COMPLETED
    # Every session retired meanwhile is closed: only B's is left.
    assert until_sessions(serving.loop, name, 1) == 1


# --- A request held behind the SDK's sender --------------------------------------------------


def hold_the_sender(hostile: Hostile, loop: asyncio.AbstractEventLoop, name: str) -> Path:
    """A call of `never` on the server's session on `loop`, given up on (its caller
    cancelled: the session is kept, and the SDK sends the server the notice that cancels
    it), the notice held by the server until the file returned is removed (let_go): the
    session's sender, which sends one notification at a time, is held meanwhile. (Held
    for 4 s once: on a loaded host the call's timeout could end after the notice was let
    go, and the test proved nothing, or failed.)"""
    hold = Path(f"{hostile.calls_file}.cancel-hold")
    hold.touch()
    endpoint, fingerprint = target(name, "never")
    hung = asyncio.run_coroutine_threadsafe(
        upstream_module.POOL.call_async(endpoint, "never", fingerprint, {}), loop
    )
    until_sent(hostile, "never")
    hung.cancel()
    until_sent(hostile, "cancel-held")
    return hold


def let_go(hold: Path) -> float:
    """The held notice let go: when (time.time())."""
    released = time.time()
    hold.unlink()
    return released


def never_sent_after(hostile: Hostile, released: float, tool: str) -> None:
    while time.time() < released + 1.0:
        time.sleep(0.1)
    assert lines(hostile, tool) == [], hostile.calls()


def test_an_inline_call_held_behind_the_senders_notice_is_answered_timed_out_never_sent(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """Agent B's inline call is made on a session whose sender is held (the server holds
    a cancel notice): it is answered at its timeout as timed out (the call's status
    timed_out, the model reads that it did not finish within its limit), and is not sent
    once the sender is free."""
    timeout = 2.0
    name = register(hostile.url, timeout=timeout)
    hold = hold_the_sender(hostile, serving.loop, name)
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    started = time.monotonic()
    got = result_of(serving.post(fx, call(1, f"{name}__echo", {"text": "b"}), session).result(60))
    took = time.monotonic() - started
    assert took < timeout + 1 + DB_MARGIN, took
    assert got["isError"] is True and "did not finish within" in text(got), got
    row = stored(session, f"{name}__echo")
    assert (row.status, row.attempts) == (Status.TIMED_OUT, 1)
    never_sent_after(hostile, let_go(hold), "echo")
    # The session it waited on was retired; the next call is served on a new one.
    got = result_of(serving.post(fx, call(2, f"{name}__echo", {"text": "c"}), session).result(60))
    assert (got["isError"], text(got)) == (False, "echo: c"), got


def as_a_worker(
    name: str, workspace: Path, timeout: float, echo: str
) -> tuple[pipeline.Outcome, float, float]:
    """The server `name`'s echo run as a worker runs it (pipeline.execute, the body on the
    pool's loop): its outcome, the seconds it took, and when it started (monotonic)."""
    tool = catalog.upstream_tool(f"{name}__echo")
    assert tool is not None
    ctx = ExecutionContext(
        workspace=workspace, call_id="rtretire", timeout=timeout, output_limit=10_000
    )
    started = time.monotonic()
    outcome = pipeline.execute(tool, ctx, {"text": echo})
    return outcome, time.monotonic() - started, started


def test_a_worker_call_held_behind_the_senders_notice_times_out_at_its_timeout_never_sent(
    hostile: Hostile, tmp_path: Path
) -> None:
    """The same on the worker lane (pipeline.execute, the body's `Pool.call` from a thread
    onto the pool's own loop): the call is answered timed out at its timeout (+1 s, the
    host's backstop), not CONNECT_TIMEOUT later, and is never sent once the sender is
    free. (The body itself ends up to 5 s after its bound expires: the SDK writes the
    notice cancelling the request it was writing, through the held sender, for up to
    _ABANDON_WRITE_TIMEOUT; the host does not wait for it.)"""
    timeout = 2.0
    name = register(hostile.url, timeout=timeout)
    pool = upstream_module.POOL
    hold = hold_the_sender(hostile, pool.loop(), name)
    outcome, took, started = as_a_worker(name, tmp_path, timeout, "w")
    assert outcome.timed_out is True, (outcome.value, outcome.error)
    # At the backstop (timeout + 1), not when the body ends (up to 5 s on) nor CONNECT_TIMEOUT
    # later: 2.5 s of room for a loaded host, half of the nearer of the two (was 0.5 s).
    assert took < timeout + 1 + 2.5, took
    never_sent_after(hostile, let_go(hold), "echo")
    endpoint, fingerprint = target(name, "echo")
    result = pool.call(endpoint, "echo", fingerprint, {"text": "x"})
    assert upstream_module.result_text(result) == "echo: x"


def test_a_worker_call_whose_session_starts_past_its_timeout_is_never_sent_afterwards(
    hostile: Hostile, tmp_path: Path
) -> None:
    """The worker lane: the server takes longer than the call's timeout (+1 s) to start a
    session; the call is answered timed out at its backstop, and is not sent once the
    session has started (its body, on the pool's loop, is cancelled only CONNECT_TIMEOUT
    later: it must check its deadline after its wait)."""
    timeout = 1.5
    # The session starts 8 s on (not 3.5): a call that waited for it takes 8 s, well past
    # the bound below, which leaves a loaded host 3 s past the backstop (it had 0.5 s).
    delay = 8.0
    name = register(hostile.url, timeout=timeout)
    Path(f"{hostile.calls_file}.initialize-delay").write_text(str(delay))
    outcome, took, started = as_a_worker(name, tmp_path, timeout, "late")
    answered_at = time.time()
    assert outcome.timed_out is True and took < timeout + 1 + 3, (took, outcome.error)
    while time.monotonic() < started + delay + 1.0:
        time.sleep(0.1)
    assert [at for at, _ in lines(hostile, "echo") if at >= answered_at] == []


def test_a_worker_calls_bound_raises_timeout_not_a_socket_error_and_is_never_sent(
    hostile: Hostile,
) -> None:
    """`Pool.call` itself (the body) raises TimeoutError (the pipeline's timed_out), not
    UpstreamError (a socket's TimeoutError is an OSError: the except clauses' order), and
    ends within the SDK's courtesy-cancel bound, not CONNECT_TIMEOUT later."""
    timeout = 2.0
    name = register(hostile.url, timeout=timeout)
    pool = upstream_module.POOL
    hold = hold_the_sender(hostile, pool.loop(), name)
    endpoint, fingerprint = target(name, "echo")
    started = time.monotonic()
    with pytest.raises(TimeoutError) as raised:
        pool.call(endpoint, "echo", fingerprint, {"text": "w"}, None, started + timeout)
    took = time.monotonic() - started
    assert not isinstance(raised.value, upstream_module.UpstreamError)
    # (5 s of room past the courtesy cancel's bound for a loaded host; CONNECT_TIMEOUT is 30)
    assert took < timeout + 1 + 5 + 5, took
    never_sent_after(hostile, let_go(hold), "echo")


# --- A stdio server's call that times out on its bound -------------------------------------


def processes_of(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if marker in cmdline and any("mcp_upstream.py" in part for part in cmdline):
            found.append(process)
    return found


def test_a_stdio_call_that_times_out_on_its_bound_stops_its_process() -> None:
    """A stdio server takes one call at a time; a call that hangs is cut by its bound
    (asyncio.timeout, not the SDK's own read timeout): the call raises TimeoutError at its
    timeout, the server's process is stopped (its session retired and closed: the hung
    call is not left running in it), and a call that waited its turn behind it is served
    by a new process, or answered timed out and never sent."""
    marker = str(40000 + uuid.uuid4().int % 20000)  # (read as the port, unused for stdio)
    name = "s" + uuid.uuid4().hex[:8]
    call_command(
        "add_mcp_server",
        name,
        "--command",
        f"{sys.executable} {ROOT / 'tests' / 'support' / 'mcp_upstream.py'} stdio {marker}",
        "--trust-annotations",
        "--timeout",
        "60",
        stdout=StringIO(),
    )
    # (the server's timeout a minute, so its first call, which starts its sandboxed
    # process, is not cut on a loaded host; the hanging call's bound is its own: 2 s)
    pool = upstream_module.POOL
    echo, echo_fingerprint = target(name, "echo")
    slow, slow_fingerprint = target(name, "slow")
    first = pool.call(echo, "echo", echo_fingerprint, {"text": "a"})
    assert upstream_module.result_text(first) == "echo: a"
    before = processes_of(marker)  # (the server, and the sandbox's launcher around it)
    assert before
    behind: list[Any] = []

    def call_behind() -> None:
        try:
            behind.append(pool.call(echo, "echo", echo_fingerprint, {"text": "b"}))
        except Exception as exc:  # noqa: BLE001 - inspected below
            behind.append(exc)

    started = time.monotonic()
    waiter = threading.Thread(target=call_behind)
    with pytest.raises(TimeoutError):
        waiter.start()
        pool.call(slow, "slow", slow_fingerprint, {"seconds": 30}, None, started + 2)
    took = time.monotonic() - started
    assert took < 2 + 10, took  # cut at its 2 s bound, well before the call's 30 s
    assert psutil.wait_procs(before, timeout=10)[1] == [], "the hung server kept running"
    waiter.join(30)
    [got] = behind
    if isinstance(got, Exception):
        assert isinstance(got, TimeoutError), got
    else:
        assert upstream_module.result_text(got) == "echo: b"
    after = pool.call(echo, "echo", echo_fingerprint, {"text": "c"})
    assert upstream_module.result_text(after) == "echo: c"
    assert not {p.pid for p in processes_of(marker)} & {p.pid for p in before}
    services.remove_server(name=name, actor="rtretire")


def register_stdio(name: str, marker: str, folder: Path, timeout: float) -> None:
    call_command(
        "add_mcp_server",
        name,
        "--command",
        f"{sys.executable} {ROOT / 'tests' / 'support' / 'mcp_upstream.py'} stdio {marker}",
        "--env",
        f"UPSTREAM_CALLS_FILE={folder / 'started.txt'}",
        "--path",
        str(folder),
        "--trust-annotations",
        "--timeout",
        str(timeout),
        stdout=StringIO(),
    )


def test_a_stdio_call_waiting_its_turn_when_the_configuration_changes_is_not_sent(
    tmp_path: Path,
) -> None:
    """A stdio server (one call at a time) runs agent A's slow call; agent B's call waits
    its turn on the same session when an admin registers the server again with another
    command, and agent C calls it (the new configuration): C is served by a new process,
    A's call ends as it would have on the retired session, B's call is not sent at all
    (neither on the retired session nor on a session of the old configuration opened
    again for it), and the retired session's process is stopped once A's call ended."""
    pool = upstream_module.POOL
    old_marker, new_marker = (str(40000 + uuid.uuid4().int % 20000) for _ in range(2))
    started_file = tmp_path / "started.txt"
    name = "s" + uuid.uuid4().hex[:8]
    register_stdio(name, old_marker, tmp_path, timeout=90)
    old, fingerprint = target(name, "slow")
    outcomes: dict[str, Any] = {}
    # A's call is held (not only slow) until C's call was answered: on a loaded machine
    # the admin's change could otherwise come after A's call ended and B's was sent
    hold = tmp_path / "started.txt.hold-2.5"
    hold.touch()

    def run(who: str, endpoint: upstream_module.Endpoint, seconds: float) -> threading.Thread:
        def body() -> None:
            try:
                result = pool.call(endpoint, "slow", fingerprint, {"seconds": seconds})
                outcomes[who] = upstream_module.result_text(result)
            except Exception as exc:  # noqa: BLE001 - inspected below
                outcomes[who] = exc

        thread = threading.Thread(target=body, name=f"rt-{who}")
        thread.start()
        return thread

    a = run("a", old, 2.5)
    deadline = time.monotonic() + 20
    while "slow 2.5" not in (started_file.read_text() if started_file.exists() else ""):
        assert time.monotonic() < deadline, "A's call was not started"
        time.sleep(0.02)
    [connection] = connections_of(pool.loop(), name)
    b = run("b", old, 0.1)
    while not connection.turns.locked() or not getattr(connection.turns, "_waiters", None):
        assert time.monotonic() < deadline, "B's call is not waiting its turn"
        time.sleep(0.02)
    old_processes = processes_of(old_marker)
    assert old_processes
    services.remove_server(name=name, actor="rtretire")
    register_stdio(name, new_marker, tmp_path, timeout=90)
    new, new_fingerprint = target(name, "slow")
    assert new_fingerprint == fingerprint
    got = pool.call(new, "slow", fingerprint, {"seconds": 0.2})
    assert upstream_module.result_text(got) == "slept 0.2"
    hold.unlink()
    a.join(60)
    b.join(60)
    assert outcomes["a"] == "slept 2.5", outcomes
    assert isinstance(outcomes["b"], upstream_module.UpstreamError), outcomes
    assert "not sent" in str(outcomes["b"]), outcomes
    assert "slow 0.1" not in started_file.read_text().splitlines(), started_file.read_text()
    assert psutil.wait_procs(old_processes, timeout=10)[1] == [], "the retired server runs on"
    assert processes_of(old_marker) == [], "a session of the old configuration was opened again"
    assert [c.endpoint for c in connections_of(pool.loop(), name)] == [new]
    services.remove_server(name=name, actor="rtretire")


# --- Retired sessions are closed: starting, twice, after a removal ---------------------------


def test_a_session_retired_while_it_starts_and_retired_twice_is_closed_once_started(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """A session still starting (the server slow to initialize) is retired with no call
    on it, twice: it is closed once it has started (its task ends; no leak), the
    calls waiting for it are not sent on it, and no error escapes its task."""
    name = register(hostile.url)
    endpoint, _fingerprint = target(name, "echo")
    Path(f"{hostile.calls_file}.initialize-delay").write_text("1.0")

    async def start_and_retire() -> upstream_module.Connection:
        connection = upstream_module.Connection(endpoint)
        await asyncio.sleep(0.2)
        connection.retire()
        connection.retire()
        return connection

    connection = asyncio.run_coroutine_threadsafe(start_and_retire(), serving.loop).result(10)
    assert until_sessions(serving.loop, name, 0) == 0
    assert connection.task.done() and not connection.task.cancelled()
    assert connection.session is None and connection.users == 0


def test_a_removed_servers_session_is_never_used_by_a_later_registration(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """A server's session is kept on the serving loop; the server is removed: a call of
    its tool is refused and never reaches it; registered again under the same name, at
    the same URL, with the same header (the same configuration, another registration),
    its next call gets a session of its own (the removed one's closed), never the one
    kept for the removed registration."""
    calls_file = hostile.calls_file
    name = register(hostile.url, "--header", "X-Probe=same")
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    first = result_of(serving.post(fx, call(1, f"{name}__probe", {}), session).result(60))
    assert text(first) == "same"
    [kept] = connections_of(serving.loop, name)
    services.remove_server(name=name, actor="rtretire")
    refused = serving.post(fx, call(2, f"{name}__probe", {"n": 2}), session).result(60)
    [message] = refused.messages()
    assert "result" not in message or message["result"]["isError"] is True, message
    assert len(lines(hostile, "probe")) == 1
    register_as(name, hostile.url, "--header", "X-Probe=same")
    Path(f"{calls_file}.initialize-log").write_text("")
    again = result_of(serving.post(fx, call(3, f"{name}__probe", {}), session).result(60))
    assert text(again).split("\n")[0] == "same", again  # (and the repeat reminder)
    assert len(lines(hostile, "initialize")) == 1, hostile.calls()  # (a session of its own)
    assert kept not in connections_of(serving.loop, name)
    assert until_sessions(serving.loop, name, 1) == 1


def test_a_removed_stdio_servers_process_does_not_run_on_in_the_worker(tmp_path: Path) -> None:
    """A stdio server's session (its sandboxed process, with its configured environment)
    is kept by the worker's pool between calls. The server is removed: once the worker
    has seen the change (its next lookup of a tool, as its next task's), the session is
    retired and the process stopped, not left running until the worker restarts or a
    server of the same name is registered."""
    pool = upstream_module.POOL
    marker = str(40000 + uuid.uuid4().int % 20000)
    name = "s" + uuid.uuid4().hex[:8]
    register_stdio(name, marker, tmp_path, timeout=8)
    echo, fingerprint = target(name, "echo")
    assert upstream_module.result_text(pool.call(echo, "echo", fingerprint, {"text": "a"}))
    running = processes_of(marker)
    assert running
    services.remove_server(name=name, actor="rtretire")
    assert catalog.upstream_tool(f"{name}__echo") is None  # (the worker's next lookup)
    assert psutil.wait_procs(running, timeout=10)[1] == [], "the removed server runs on"
    assert connections_of(pool.loop(), name) == []


# --- A call resolved before a configuration change, arriving after it ------------------------


def probe_on(loop: asyncio.AbstractEventLoop, endpoint: upstream_module.Endpoint, fp: str) -> str:
    """A `probe` call with `endpoint` on `loop` (the pool's serving-loop lane): the header
    the server saw, or the error's text."""
    try:
        result = asyncio.run_coroutine_threadsafe(
            upstream_module.POOL.call_async(endpoint, "probe", fp, {}), loop
        ).result(30)
    except upstream_module.UpstreamError as exc:
        return f"UpstreamError: {exc}"
    return upstream_module.result_text(result).split("\n")[0]


@pytest.mark.parametrize("old_session_here", [True, False])
def test_a_call_resolved_before_a_configuration_change_never_reopens_the_old_one(
    hostile: Hostile, serving: ServingLoop, old_session_here: bool
) -> None:
    """A call whose tool was looked up before its server's configuration changed (it
    carries the old URL and header) reaches the serving loop after a call of the new
    configuration has opened its session there (with or without a session of the old one
    on that loop before). It is not sent, no session with the old header is opened (the
    old credentials used after the change), and the new configuration's session is not
    retired for it (before the fix: the old one opened again, the new one retired, ping-
    pong with every call of either)."""
    calls_file = hostile.calls_file
    name = register(hostile.url, "--header", "X-Probe=old")
    old, old_fingerprint = target(name, "probe")
    if old_session_here:
        assert probe_on(serving.loop, old, old_fingerprint) == "old"
    # The change: the server registered again under its name, with another header.
    Path(f"{calls_file}.initialize-log").write_text("")
    services.remove_server(name=name, actor="rtretire")
    register_as(name, hostile.url, "--header", "X-Probe=new")
    new, fingerprint = target(name, "probe")
    changed_at = time.time()
    assert probe_on(serving.loop, new, fingerprint) == "new"
    [session] = connections_of(serving.loop, name)
    for _ in range(3):  # the old call, and the new one after it, again and again
        refused = probe_on(serving.loop, old, old_fingerprint)
        assert refused == f"UpstreamError: {upstream_module.SUPERSEDED}", refused
        assert probe_on(serving.loop, new, fingerprint) == "new"
    # (the registration's own listing initialized before `changed_at`)
    opened = [probe["probe"] for at, probe in lines(hostile, "initialize") if at > changed_at]
    assert opened == ["new"], hostile.calls()  # the new one's, kept; never the old again
    assert connections_of(serving.loop, name) == [session]
    services.remove_server(name=name, actor="rtretire")


def test_a_call_of_an_older_version_of_the_same_server_is_not_sent() -> None:
    """The same server (its id) at two versions: once the newer has a session on a loop, a
    call with the older is refused there without a session being opened, whatever the
    loop saw before (checked on the pool's own bookkeeping, no server needed: the refusal
    comes before any connection)."""
    pool = upstream_module.Pool()
    newer = upstream_module.Endpoint(
        server_id=7, version=3, name="v", transport="http", url="http://127.0.0.1:9/new"
    )
    older = dataclasses.replace(newer, version=2, url="http://127.0.0.1:9/old")

    async def attempt() -> str:
        kept = pool._on_this_loop()[newer] = upstream_module.Connection(newer)
        await asyncio.wait_for(kept.ready.wait(), 10)  # (its start over: refused, port 9)
        try:
            await pool._connection(older)
        except upstream_module.UpstreamError as exc:
            return str(exc)
        finally:
            assert pool._on_this_loop().get(newer) is kept and not kept.superseded
            kept.retire()
            await asyncio.wait({kept.task}, timeout=10)
        return "opened"

    assert asyncio.run(attempt()) == upstream_module.SUPERSEDED
