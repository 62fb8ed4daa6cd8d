"""Red-team of 81adc54: an inline call's upstream request is made on the event loop of the
web request that awaits it (upstream.Pool.loop_for, ExecutionContext.loop), sessions kept
per loop. On daphne that loop is the one serving every HTTP request, so an upstream's
misbehaviour now happens on it. Each test is an attack, driven in-process through the
real gateway (/mcp/) on one long-lived loop in a thread of its own, as daphne's, against
a hostile upstream HTTP server (tests/support/mcp_hostile_upstream.py, a real process);
it passes when the attack fails: the host-only timeout holds, calls fail closed and run
once, the loop keeps serving other agents, a configuration change is never served by an
old session, a request that hangs up leaves no call on a dead loop.

Two defects found and fixed with them: a call still waiting for its session when the
host gave up on it (timed out) was sent once the session started, after its agent was
told it timed out (upstream.Pool.call's deadline; older than 81adc54); and an inline
call's connection waited for a thread of the serving loop's default executor to resolve
the server's name (floor.outbound's resolver threads; a regression of 81adc54)."""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any, cast

import pytest
from django.core.management import call_command

from audit.models import AuditEvent
from dispatcher.gateways import mcp_http
from dispatcher.gateways.mcp_http import split_session_id
from dispatcher.models import Status, ToolCall
from dispatcher.tools.sources import catalog, services
from dispatcher.tools.sources import upstream as upstream_module
from tests.mcp.test_fast_path import Answer, call
from tests.support.factories import AgentFixture, make_agent
from tests.support.live import free_port, stop, wait_for_port
from tests.support.mcp_requests import HANDSHAKE, initialize
from tests.support.paths import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]

HOSTILE = ROOT / "tests" / "support" / "mcp_hostile_upstream.py"
TIMEOUT = 2.0  # the hostile server's tools' timeout (seconds, --timeout)
# What a request may take beyond its tool's host-only timeout (pipeline.execute's
# backstop, timeout + 1 s): the admission's and the result's trips to the database.
DB_MARGIN = 3.0


@dataclass
class Hostile:
    url: str
    calls_file: Path

    def calls(self) -> list[str]:
        if not self.calls_file.exists():
            return []
        return self.calls_file.read_text().splitlines()


@pytest.fixture
def hostile(tmp_path: Path, settings: Any) -> Iterator[Hostile]:
    port = free_port()
    settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{port}"]
    log, calls = tmp_path / "hostile.log", tmp_path / "calls.txt"
    proc = subprocess.Popen(
        [sys.executable, str(HOSTILE), str(port), str(calls)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, proc, log)
        yield Hostile(f"http://127.0.0.1:{port}/mcp", calls)
    finally:
        stop(proc)


def register(url: str, *extra: str, timeout: float = TIMEOUT) -> str:
    """The server registered with a fresh name, its annotations trusted (its tools are
    auto-allowed and run inline), `timeout` seconds a call; its name."""
    name = "h" + uuid.uuid4().hex[:8]
    register_as(name, url, *extra, timeout=timeout)
    return name


class ServingLoop:
    """One event loop in a thread of its own that serves every request, as daphne's does;
    `lag` the longest it was kept from running a ready callback while it was watched."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="serving", daemon=True)
        self.thread.start()
        self.lag = 0.0

    def post(self, fx: AgentFixture, body: Any, session: str = "") -> Request:
        """The request (as Gateway.post sends it), served on this loop; its client waits
        for the answer as daphne's do (http.disconnect only when it hangs up)."""
        headers = {
            "host": "localhost",
            "authorization": f"Bearer {fx.token}",
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            **({"mcp-session-id": session, "mcp-protocol-version": HANDSHAKE} if session else {}),
        }
        gone = asyncio.Event()
        exchange = self._exchange(json.dumps(body).encode(), headers, gone)
        future = asyncio.run_coroutine_threadsafe(exchange, self.loop)
        return Request(future, lambda: self.loop.call_soon_threadsafe(gone.set))

    async def _exchange(self, body: bytes, headers: dict[str, str], gone: asyncio.Event) -> Answer:
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/mcp/",
            "scheme": "http",
            "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        }
        sent: list[Any] = []
        arrived = [False]

        async def receive() -> dict[str, Any]:
            if not arrived[0]:
                arrived[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                gone.set()

        await mcp_http.application(scope, receive, send)
        gone.set()
        return Answer(
            sent[0]["status"] if sent else 0,
            {k.decode(): v.decode() for k, v in sent[0]["headers"]} if sent else {},
            b"".join(m.get("body", b"") for m in sent[1:]),
            via_sdk=False,
        )

    def session(self, fx: AgentFixture) -> str:
        answer = self.post(fx, initialize("rtloop", run=uuid.uuid4().hex)).result(60)
        return answer.headers["mcp-session-id"]

    def watch(self) -> threading.Event:
        """Measure the loop's lag until the event returned is set."""
        done = threading.Event()

        async def ticker() -> None:
            while not done.is_set():
                before = time.monotonic()
                await asyncio.sleep(0.01)
                self.lag = max(self.lag, time.monotonic() - before - 0.01)

        asyncio.run_coroutine_threadsafe(ticker(), self.loop)
        return done

    def close(self) -> None:
        async def cancel_all() -> None:
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()


@pytest.fixture
def serving() -> Iterator[ServingLoop]:
    loop = ServingLoop()
    try:
        yield loop
    finally:
        loop.close()


@dataclass
class Request:
    future: Future[Answer]
    hang_up: Any  # the client goes away (http.disconnect)

    def result(self, timeout: float) -> Answer:
        return self.future.result(timeout)

    def cancel(self) -> None:
        """The server cancels the request's task outright (daphne, past its grace)."""
        self.future.cancel()


def stored(session: str, tool: str) -> ToolCall:
    return ToolCall.objects.get(session__external_id=split_session_id(session)[0], name=tool)


def result_of(answer: Answer) -> dict[str, Any]:
    assert answer.status == 200, answer.body[:500]
    [message] = answer.messages()
    result: dict[str, Any] = message["result"]
    return result


# --- An upstream that never answers ------------------------------------------------------


def test_an_upstream_that_never_answers_is_cut_at_the_timeout_and_others_are_served(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """The call of a tool whose server never answers ends at its host-only timeout (+1 s)
    as timed out; meanwhile another agent's call of the same server, on the same loop and
    the same shared session, is sent at once and answered while the first still hangs:
    calls are in flight on one session side by side (upstream.HTTP_IN_FLIGHT), so one
    agent's hung call does not make another's wait for it (before, one request at a time
    per session: the echo waited the whole timeout, or timed out unsent)."""
    name = register(hostile.url)
    fx, other = make_agent(mode="trusted"), make_agent(mode="trusted")
    session, other_session = serving.session(fx), serving.session(other)
    started = time.monotonic()
    held = serving.post(fx, call(1, f"{name}__never", {}), session)
    until_sent(hostile, "never")
    echo_started = time.monotonic()
    echoed = serving.post(other, call(1, f"{name}__echo", {"text": "other"}), other_session)
    echo = result_of(echoed.result(60))
    echo_took = time.monotonic() - echo_started
    hung_meanwhile = not held.future.done()
    answer = held.result(60)
    held_took = time.monotonic() - started
    result = result_of(answer)
    assert result["isError"] is True
    assert held_took < TIMEOUT + 1 + DB_MARGIN, held_took
    call_row = stored(session, f"{name}__never")
    assert (call_row.status, call_row.attempts) == (Status.TIMED_OUT, 1)
    echo_row = stored(other_session, f"{name}__echo")
    assert (echo_row.status, echo["content"]) == (
        Status.COMPLETED,
        [{"type": "text", "text": "echo: other"}],
    ), (echo_row.status, echo, echo_took)
    assert hung_meanwhile, "the echo was answered only once the hung call had ended"
    assert [line.split()[0] for line in hostile.calls()] == ["never", "echo"]


def until_sent(hostile: Hostile, tool: str, count: int = 1, seconds: float = 10) -> None:
    """Until the server has received `count` calls of `tool`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if sum(line.split()[0] == tool for line in hostile.calls()) >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"{count} x {tool} not sent: {hostile.calls()}")


# --- Broken answers: fail closed, once -----------------------------------------------------


@pytest.mark.parametrize("tool", ["close", "garbage"])
def test_a_broken_answer_fails_closed_once_and_the_next_call_is_served(
    hostile: Hostile, serving: ServingLoop, tool: str
) -> None:
    """An upstream that closes the connection mid-answer, or answers bytes that are no
    JSON: the call fails (an error the model reads), is stored so, was sent once; the
    next call on the same loop is answered (a broken session is not kept)."""
    name = register(hostile.url)
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    started = time.monotonic()
    broken = result_of(serving.post(fx, call(1, f"{name}__{tool}", {}), session).result(60))
    took = time.monotonic() - started
    assert broken["isError"] is True
    assert took < TIMEOUT + 1 + DB_MARGIN, took
    row = stored(session, f"{name}__{tool}")
    assert (row.status, row.attempts, row.is_error) == (Status.COMPLETED, 1, True)
    assert f"The MCP server '{name}'" in row.content and row.content == broken["content"][0]["text"]
    echo = result_of(
        serving.post(fx, call(2, f"{name}__echo", {"text": "after"}), session).result(60)
    )
    assert echo["content"] == [{"type": "text", "text": "echo: after"}]
    assert [line.split()[0] for line in hostile.calls()] == [tool, "echo"]


# --- A huge answer on the serving loop -----------------------------------------------------


def test_a_huge_answer_does_not_stall_the_serving_loop(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """An upstream answers 30 MB (just under the door's 32 MB) as one SSE event: its
    reading and parsing now happen on the serving loop. The loop keeps serving: its
    longest stall stays under the tool's timeout, and another agent's call is answered."""
    name = register(hostile.url)
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    done = serving.watch()
    try:
        started = time.monotonic()
        answer = serving.post(fx, call(1, f"{name}__huge", {"megabytes": 30}), session).result(60)
        took = time.monotonic() - started
    finally:
        done.set()
    result = result_of(answer)
    print(f"huge: took {took:.2f}s, loop lag {serving.lag:.3f}s")
    assert took < TIMEOUT + 1 + DB_MARGIN, took
    assert result["content"][0]["text"].startswith("x" * 1000)
    assert serving.lag < TIMEOUT / 2, serving.lag


# --- A call that waited past its timeout is not sent afterwards ----------------------------


def test_a_call_reported_timed_out_while_waiting_its_turn_is_never_sent_afterwards(
    hostile: Hostile, serving: ServingLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two agents' calls of a server that never answers hold every turn of its session
    (here upstream.HTTP_IN_FLIGHT is 2) for a timeout each; a third agent's echo waits
    its turn behind them past its own host-only timeout, and is answered as timed out.
    Then it must not be sent: the host told its agent it timed out (the agent may send it
    again) and forgot it. Every call the server received arrived before the host's answer
    of that call."""
    monkeypatch.setattr(upstream_module, "HTTP_IN_FLIGHT", 2)
    name = register(hostile.url)
    a, b, c = (make_agent(mode="trusted") for _ in range(3))
    sessions = [serving.session(fx) for fx in (a, b, c)]
    first = serving.post(a, call(1, f"{name}__never", {}), sessions[0])
    time.sleep(0.2)
    second = serving.post(b, call(1, f"{name}__never", {}), sessions[1])
    time.sleep(0.2)
    started = time.monotonic()
    third = serving.post(c, call(1, f"{name}__echo", {"text": "late"}), sessions[2])
    echo = result_of(third.result(60))
    answered_at = time.time()
    took = time.monotonic() - started
    assert took < TIMEOUT + 1 + DB_MARGIN, took
    first.result(60), second.result(60)
    row = stored(sessions[2], f"{name}__echo")
    assert row.attempts == 1
    # What the server received, once the sessions had time to let the echo through (the
    # second `never` ends at its read timeout, then a new session would be opened).
    time.sleep(TIMEOUT + 1)
    echoes = [line for line in hostile.calls() if line.startswith("echo ")]
    if row.status == Status.TIMED_OUT:
        assert echo["isError"] is True
        assert [float(line.split()[1]) < answered_at for line in echoes] == [True] * len(echoes)
        assert len(echoes) <= 1
    else:
        assert (row.status, echo["content"]) == (
            Status.COMPLETED,
            [{"type": "text", "text": "echo: late"}],
        )
        assert len(echoes) == 1


def test_a_call_whose_session_starts_past_its_timeout_is_never_sent_afterwards(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """The server takes longer than the tool's timeout (+1 s) to start a session: the call
    is answered as timed out at the host-only timeout, and is not sent once the session
    has started (the agent was told it timed out, and may send it again)."""
    name = register(hostile.url)
    delay = TIMEOUT + 2
    Path(f"{hostile.calls_file}.initialize-delay").write_text(str(delay))
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    started = time.monotonic()
    echo = result_of(
        serving.post(fx, call(1, f"{name}__echo", {"text": "late"}), session).result(60)
    )
    answered_at, took = time.time(), time.monotonic() - started
    assert took < TIMEOUT + 1 + DB_MARGIN, took
    assert echo["isError"] is True
    row = stored(session, f"{name}__echo")
    assert (row.status, row.attempts) == (Status.TIMED_OUT, 1)
    time.sleep(max(0.0, delay - took) + 1.5)  # the session has started by now
    late = [line for line in hostile.calls() if float(line.split()[1]) >= answered_at]
    assert late == []


# --- Sessions shared on a loop: configurations and servers kept apart ----------------------


def test_a_changed_configuration_is_never_served_by_the_old_session(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """A server's session is kept on the serving loop between requests. Removed and
    registered again under the same name with another header, its next call is made with
    the new header (a new session), never through the one kept open with the old."""
    name = register(hostile.url, "--header", "X-Probe=old")
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    first = result_of(serving.post(fx, call(1, f"{name}__probe", {}), session).result(60))
    assert first["content"] == [{"type": "text", "text": "old"}]
    services.remove_server(name=name, actor="rtloop")
    register_as(name, hostile.url, "--header", "X-Probe=new")
    second = result_of(serving.post(fx, call(2, f"{name}__probe", {}), session).result(60))
    assert second["content"] == [{"type": "text", "text": "new"}]
    # The loop keeps one session per configuration of a server: the old one was closed.
    kept = upstream_module.POOL._connections.get(serving.loop, {})
    assert [dict(e.headers).get("X-Probe") for e in kept if e.name == name] == ["new"]


def test_two_servers_at_one_address_with_other_headers_never_share_a_session(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """Two teams' servers at the same URL, each with its own credentials header: called at
    once, on the same loop, each call carries its own server's header."""
    one = register(hostile.url, "--header", "X-Probe=one")
    two = register(hostile.url, "--header", "X-Probe=two")
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    answers = [
        serving.post(fx, call(i, f"{server}__probe", {}), session)
        for i, server in enumerate([one, two, one, two, one, two])
    ]
    texts = [result_of(a.result(60))["content"][0]["text"] for a in answers]
    # (each answer's first line: the third same call of a session may also carry the
    # repeat reminder, depending on how the concurrent admissions interleave)
    assert [text.split("\n")[0] for text in texts] == ["one", "two"] * 3, texts


def register_as(name: str, url: str, *extra: str, timeout: float = TIMEOUT) -> None:
    """The server registered as `name` (see `register`)."""
    call_command(
        "add_mcp_server",
        name,
        "--url",
        url,
        "--trust-annotations",
        "--timeout",
        str(timeout),
        *extra,
        stdout=StringIO(),
    )


# --- A request that goes away while its call runs -----------------------------------------


@pytest.mark.parametrize("how", ["hangs_up", "is_cancelled"])
def test_a_request_gone_mid_call_leaves_the_call_run_once_and_the_loop_serving(
    hostile: Hostile, serving: ServingLoop, how: str
) -> None:
    """The client hangs up (http.disconnect), or the server cancels the request's task
    outright (as daphne does to an application that outlives its client), while the call
    runs on the request's loop: the call is run once and its result stored, within its
    timeout; the loop goes on serving (the next request is answered)."""
    name = register(hostile.url)
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    started = time.monotonic()
    request = serving.post(fx, call(1, f"{name}__sleep", {"seconds": 1}), session)
    deadline = time.monotonic() + 10
    while not hostile.calls() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert hostile.calls(), "the call did not reach the server"
    if how == "hangs_up":
        request.hang_up()
    else:
        request.cancel()
    row = stored(session, f"{name}__sleep")
    while row.status in (Status.RUNNING, Status.RECEIVED, Status.QUEUED):
        assert time.monotonic() - started < TIMEOUT + 1 + DB_MARGIN, row.status
        time.sleep(0.05)
        row.refresh_from_db()
    assert (row.status, row.content, row.attempts) == (Status.COMPLETED, "slept 1", 1)
    after = result_of(
        serving.post(fx, call(2, f"{name}__echo", {"text": "next"}), session).result(60)
    )
    assert after["content"] == [{"type": "text", "text": "echo: next"}]
    assert [line.split()[0] for line in hostile.calls()] == ["sleep", "echo"]


# --- What the upstream request needs of the serving loop -----------------------------------


def test_an_inline_call_does_not_wait_for_the_serving_loops_default_executor(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """The serving loop's default executor is shared by every request's short sync work
    (sync_to_async(thread_sensitive=False): the wait slot's give-back, release_wait), and
    may be busy (a Redis that stalls). An inline call's upstream request, now made on that
    loop, must not wait for one of its threads (the name's resolution did: the outbound
    door's anyio.getaddrinfo), as it did not on the pool's own loop: the call is answered."""
    name = register(hostile.url)
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    release = threading.Event()
    executor_threads = 64  # more than any default executor has
    busy = [
        serving.loop.call_soon_threadsafe(serving.loop.run_in_executor, None, release.wait, 30)
        for _ in range(executor_threads)
    ]
    try:
        started = time.monotonic()
        echo = result_of(
            serving.post(fx, call(1, f"{name}__echo", {"text": "busy"}), session).result(60)
        )
        took = time.monotonic() - started
    finally:
        release.set()
    assert len(busy) == executor_threads
    assert echo["content"] == [{"type": "text", "text": "echo: busy"}], echo
    assert took < TIMEOUT + 1 + DB_MARGIN, took
    assert stored(session, f"{name}__echo").status == Status.COMPLETED


def test_a_stdio_servers_call_is_never_made_on_the_serving_loop(serving: ServingLoop) -> None:
    """A stdio server is a process that outlives any request: its auto-allowed call is not
    run inline (it is queued for a worker), and were its body run with a request's loop,
    its request would still go to the pool's own loop (upstream.Pool.loop_for)."""
    name = "s" + uuid.uuid4().hex[:8]
    call_command(
        "add_mcp_server",
        name,
        "--command",
        f"{sys.executable} {ROOT / 'tests' / 'support' / 'mcp_upstream.py'} stdio",
        "--trust-annotations",
        stdout=StringIO(),
    )
    tool = catalog.upstream_tool(f"{name}__echo")
    assert tool is not None and tool.inline is False
    # (functools.partial(services.run_tool, endpoint, ...))
    endpoint = cast(functools.partial[Any], tool.execute).args[0]
    assert endpoint.transport == "stdio"
    pool = upstream_module.POOL
    assert pool.loop_for(endpoint, serving.loop) is pool.loop()
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    request = serving.post(fx, call(1, f"{name}__echo", {"text": "p"}), session)
    deadline = time.monotonic() + 10
    while not ToolCall.objects.filter(name=f"{name}__echo").exists():
        assert time.monotonic() < deadline, "the call was not recorded"
        time.sleep(0.05)
    # Not claimed by its admission (an inline call is written claimed, its call.started
    # by "inline", in the admission's commit): queued, or already a worker's (a live
    # stack's worker may be serving this test process's queue).
    row = stored(session, f"{name}__echo")
    claims = AuditEvent.objects.filter(subject=f"call:{row.pk}", kind="call.started")
    assert "inline" not in set(claims.values_list("actor", flat=True)), row.status
    assert row.status != Status.RUNNING or claims.exists(), row.status
    assert [e for e in pool._connections.get(serving.loop, {}) if e.name == name] == []
    request.hang_up()
