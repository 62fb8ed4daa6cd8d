"""Red-team of f242d43: an HTTP server's upstream session carries up to
upstream.HTTP_IN_FLIGHT calls in flight at once (an asyncio.Semaphore of turns), a session
that timed out or broke is retired (replaced at once, closed after its last call), the
door's async pool opens up to 100 connections. Each test is an attack on calls of several
agents sharing one session, driven through the real gateway (/mcp/) on an in-process
serving loop (tests/redteam/test_inline_loop_attacks.py's) against the hostile upstream
process (tests/support/mcp_hostile_upstream.py); it passes when the attack fails.

Three defects found and fixed with them. Two in upstream._Transport: one request's POST that
failed (its connection cut, its answer past the door's cap, its read timed out) ended the
SDK transport's task group, so every other agent's call in flight on the shared session
was cut and answered "not known whether the call took effect"; and a call given up on
(timed out, or cancelled at the host's backstop) kept its POST's connection open until the
server answered (the SDK ends it at the 2026 protocol only), so that abandoned requests
piled up beside the 64 turns, past the client's 100 connections, where a new call's request
waits inside the HTTP client, unchecked against its deadline. And (older than f242d43) a
server that no longer knew the session (restarted: 404) kept it in the pool, so that every
later call of the server failed "Session terminated" until the process restarted."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from dispatcher.gateways.mcp import TOO_MANY_WAITS
from dispatcher.gateways.mcp_http import split_session_id
from dispatcher.models import Status, ToolCall
from dispatcher.tools.sources import services
from dispatcher.tools.sources import upstream as upstream_module
from tests.mcp.test_fast_path import call
from tests.redteam import test_inline_loop_attacks as loop_attacks
from tests.redteam.test_inline_loop_attacks import (
    DB_MARGIN,
    TIMEOUT,
    Hostile,
    ServingLoop,
    register,
    register_as,
    result_of,
    stored,
    until_sent,
)
from tests.support.factories import make_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]

hostile = loop_attacks.hostile  # (a hostile upstream server process, loopback)
serving = loop_attacks.serving  # (one event loop serving every request, as daphne's)


def text(result: dict[str, Any]) -> str:
    return str(result["content"][0]["text"])


def arrived(hostile: Hostile, tool: str) -> list[float]:
    return [float(line.split()[1]) for line in hostile.calls() if line.split()[0] == tool]


# --- One agent's broken answer does not cut another's call (defect, fixed) ----------------


@pytest.mark.parametrize(("tool", "arguments"), [("close", {}), ("huge", {"megabytes": 40})])
def test_a_broken_answer_cuts_only_its_own_call_not_anothers_in_flight(
    hostile: Hostile, serving: ServingLoop, tool: str, arguments: dict[str, Any]
) -> None:
    """Agent A's call whose answer is cut mid-body (`close`) or runs past the door's 32 MB
    cap (`huge`, 40 MB) fails closed, while agent B's call of the same server is in flight
    on the same session: B's call is answered with its own result. (Before, the failed
    POST ended the SDK transport's task group: B was told the server stopped and that it
    is not known whether its call took effect.)"""
    name = register(hostile.url, timeout=4.0)
    a, b = make_agent(mode="trusted"), make_agent(mode="trusted")
    session_a, session_b = serving.session(a), serving.session(b)
    slow = serving.post(b, call(1, f"{name}__sleep", {"seconds": 1.5}), session_b)
    until_sent(hostile, "sleep")
    broken = result_of(serving.post(a, call(1, f"{name}__{tool}", arguments), session_a).result(60))
    assert broken["isError"] is True
    assert not slow.future.done(), "B's call ended with A's"
    other = result_of(slow.result(60))
    assert (other["isError"], text(other)) == (False, "slept 1.5"), other
    row = stored(session_b, f"{name}__sleep")
    assert (row.status, row.attempts, row.is_error) == (Status.COMPLETED, 1, False)
    assert [line.split()[0] for line in hostile.calls()] == ["sleep", tool]


# --- A call given up on keeps no connection (defect, fixed) --------------------------------


def test_a_call_given_up_on_frees_its_connection_while_its_session_still_serves(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """Agent A's call of a tool that trickles its answer (a byte every 0.2 s: no read
    timeout fires) times out; agent B's slow call keeps the retired session open past it.
    A's request's connection is closed at A's timeout, not left open until the session
    closes: a request given up on holds no connection of the session's HTTP client
    (before, at the 2025 protocols the SDK speaks to this server, it held it until the
    server answered, or for ever; 36 such beside the 64 turns filled the client's 100
    connections, and the next call's POST waited inside the HTTP client past its
    deadline)."""
    timeout = 4.0
    name = register(hostile.url, timeout=timeout)
    a, b = make_agent(mode="trusted"), make_agent(mode="trusted")
    session_a, session_b = serving.session(a), serving.session(b)
    started = time.time()
    trickle = serving.post(a, call(1, f"{name}__trickle", {}), session_a)
    until_sent(hostile, "trickle")
    # (B is sent 2.5 s into A's 4 s and ends about 2 s after A's timeout: the gap the last
    # assertion reads; with 1.5 s, a loaded machine once left it 0.4 s)
    time.sleep(2.5)
    slow = serving.post(b, call(1, f"{name}__sleep", {"seconds": 3.5}), session_b)
    until_sent(hostile, "sleep")
    timed_out = result_of(trickle.result(60))
    assert timed_out["isError"] is True
    other = result_of(slow.result(60))
    slept_until = time.time()
    assert text(other) == "slept 3.5", other
    deadline = time.monotonic() + 5
    while not arrived(hostile, "trickle-closed") and time.monotonic() < deadline:
        time.sleep(0.05)
    [closed] = arrived(hostile, "trickle-closed")
    assert closed - started < timeout + 1 + DB_MARGIN, (closed - started, hostile.calls())
    assert closed < slept_until - 0.5, (closed - started, slept_until - started)


# --- Answers out of order go to their own callers ------------------------------------------


def test_many_agents_calls_answered_out_of_order_each_get_their_own_result(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """Six agents send four calls each at once on the one shared session, each sleeping
    for its own time, the last sent answered first: every call is answered with its own
    result (the JSON-RPC ids kept apart under concurrency), stored once, sent once."""
    name = register(hostile.url, timeout=4.0)
    agents = [make_agent(mode="trusted") for _ in range(6)]
    sessions = [serving.session(fx) for fx in agents]
    sent = []
    for round_ in range(4):
        for i, (fx, session) in enumerate(zip(agents, sessions, strict=True)):
            seconds = round(1.2 - 0.05 * (round_ * 6 + i), 2)
            request = serving.post(
                fx, call(round_ + 1, f"{name}__sleep", {"seconds": seconds}), session
            )
            sent.append((session, seconds, request))
    for _session, seconds, request in sent:
        result = result_of(request.result(60))
        assert (result["isError"], text(result)) == (False, f"slept {seconds}"), (seconds, result)
    for session in sessions:
        rows = list(stored_all(session, f"{name}__sleep"))
        assert [(row.status, row.attempts) for row in rows] == [(Status.COMPLETED, 1)] * 4
    assert len(arrived(hostile, "sleep")) == 24


def stored_all(session: str, tool: str) -> Any:
    return ToolCall.objects.filter(
        session__external_id=split_session_id(session)[0], name=tool
    ).order_by("pk")


# --- Retired sessions: closed after their last call, nothing left open ---------------------


def connections_of(serving: ServingLoop, name: str) -> list[upstream_module.Connection]:
    kept = upstream_module.POOL._connections.get(serving.loop, {})
    return [c for e, c in list(kept.items()) if e.name == name]


def sockets_to(port: int) -> int:
    return sum(
        1 for c in psutil.Process().net_connections(kind="tcp") if c.raddr and c.raddr.port == port
    )


def test_sixty_four_hung_calls_retire_their_session_and_leave_nothing_open(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """Eight agents fill every turn of the session with calls of a server that never
    answers (8 x 8 = HTTP_IN_FLIGHT); a ninth agent's call of the same server waits its
    turn, and is either answered (on the session that replaced it) or answered timed out
    and never sent afterwards. Each of the 64 is answered timed out in time; the
    session is retired and closed once its last call ended: its task done, no call in
    flight counted on it, and no connection of this process to the server left open but
    those of the session that replaced it."""
    port = int(hostile.url.split(":")[2].split("/")[0])
    name = register(hostile.url)
    agents = [make_agent(mode="trusted") for _ in range(8)]
    sessions = [serving.session(fx) for fx in agents]
    warm = serving.post(agents[0], call(99, f"{name}__echo", {"text": "warm"}), sessions[0])
    assert text(result_of(warm.result(60))) == "echo: warm"
    [first] = connections_of(serving, name)
    started = time.monotonic()
    hung = [
        serving.post(fx, call(n, f"{name}__never", {"n": n}), session)
        for n in range(8)
        for fx, session in zip(agents, sessions, strict=True)
    ]
    until_sent(hostile, "never", 64, seconds=20)
    late = make_agent(mode="trusted")
    late_session = serving.session(late)
    waited = serving.post(late, call(1, f"{name}__echo", {"text": "late"}), late_session)
    for request in hung:
        result = result_of(request.result(60))
        assert result["isError"] is True, result
    took = time.monotonic() - started
    assert took < TIMEOUT + 1 + DB_MARGIN + 2, took
    echo = result_of(waited.result(60))
    answered_at = time.time()
    deadline = time.monotonic() + 8
    while not first.task.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.task.done() and first.retired and first.users == 0
    assert first not in connections_of(serving, name)
    assert len(connections_of(serving, name)) <= 1
    assert sockets_to(port) <= 2, sockets_to(port)
    echoes = arrived(hostile, "echo")
    if echo["isError"]:  # (timed out waiting its turn: never sent afterwards)
        assert [t < answered_at for t in echoes] == [True] * len(echoes)
    else:
        assert text(echo) == "echo: late"
    assert len(arrived(hostile, "never")) == 64


# --- A configuration change under calls in flight -----------------------------------------


def test_a_configuration_change_under_calls_in_flight_never_serves_the_old_session(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """Agent B's calls are in flight on the session of a server's old configuration when
    an admin registers it again with another header: agent A's next call is made with the
    new header, and each of B's calls is answered either with its own result or honestly
    (the server stopped: not known whether it took effect), never as completed without
    one."""
    name = register(hostile.url, "--header", "X-Probe=old", timeout=4.0)
    a, b = make_agent(mode="trusted"), make_agent(mode="trusted")
    session_a, session_b = serving.session(a), serving.session(b)
    first = result_of(serving.post(a, call(1, f"{name}__probe", {}), session_a).result(60))
    assert text(first) == "old"
    slow = [
        serving.post(b, call(n, f"{name}__sleep", {"seconds": 1.0 + n / 10}), session_b)
        for n in range(1, 4)
    ]
    until_sent(hostile, "sleep", 3)
    services.remove_server(name=name, actor="rtconcurrent")
    register_as(name, hostile.url, "--header", "X-Probe=new", timeout=4.0)
    second = result_of(serving.post(a, call(2, f"{name}__probe", {}), session_a).result(60))
    assert text(second) == "new"
    for n, request in enumerate(slow, start=1):
        result = result_of(request.result(60))
        said = text(result)
        if result["isError"]:
            assert "not known whether the call took effect" in said or "no longer" in said, said
        else:
            assert said == f"slept {1.0 + n / 10}", said
    kept = [dict(c.endpoint.headers).get("X-Probe") for c in connections_of(serving, name)]
    assert kept == ["new"], kept


# --- One agent's hung calls do not hold up another's ---------------------------------------


def test_an_agent_with_all_its_slots_hung_holds_up_no_other_agent(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """Agent A holds its eight wait slots with calls of a server that never answers (its
    ninth is refused: too many waits, not queued); agent B's call of the same server, on
    the same session, is answered at once while A's still hang.

    (A's calls have a 10 s timeout, not 2 s: on a loaded host the ninth's refusal and B's
    answer could outlast 2 s, and A's calls then ended before B's was answered.)"""
    timeout = 10.0
    name = register(hostile.url, timeout=timeout)
    a, b = make_agent(mode="trusted"), make_agent(mode="trusted")
    session_a, session_b = serving.session(a), serving.session(b)
    hung = [serving.post(a, call(n, f"{name}__never", {"n": n}), session_a) for n in range(8)]
    until_sent(hostile, "never", 8)
    ninth = serving.post(a, call(9, f"{name}__never", {"n": 9}), session_a).result(60)
    [message] = ninth.messages()
    assert message.get("error", {}).get("code") == TOO_MANY_WAITS, message
    started = time.monotonic()
    echo = result_of(serving.post(b, call(1, f"{name}__echo", {"text": "b"}), session_b).result(60))
    took = time.monotonic() - started
    # Answered while A's still hang (queued behind them, it would wait for their timeout)
    assert text(echo) == "echo: b" and took < timeout / 2, (echo, took)
    assert not any(request.future.done() for request in hung)
    for request in hung:
        assert result_of(request.result(60))["isError"] is True
    assert len(arrived(hostile, "never")) == 8


# --- A server that forgot its sessions (restarted) ----------------------------------------


def test_a_server_that_forgot_the_session_gets_a_new_one_for_the_next_call(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """A server that gives session ids is restarted (it forgets them: a request naming one
    is answered 404, which the SDK reads as "Session terminated"). The call that found the
    session gone fails closed (it was not run); the session is replaced, so the next call
    is answered (before, the session was kept: every later call of the server in that
    process failed "Session terminated", until the process restarted)."""
    Path(f"{hostile.calls_file}.sessions").write_text("")
    name = register(hostile.url)
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    first = result_of(
        serving.post(fx, call(1, f"{name}__echo", {"text": "one"}), session).result(60)
    )
    assert text(first) == "echo: one"
    forgot = result_of(serving.post(fx, call(2, f"{name}__forget", {}), session).result(60))
    assert text(forgot) == "forgotten"
    gone = result_of(
        serving.post(fx, call(3, f"{name}__echo", {"text": "two"}), session).result(60)
    )
    assert gone["isError"] is True and f"The MCP server '{name}'" in text(gone), gone
    after = result_of(
        serving.post(fx, call(4, f"{name}__echo", {"text": "three"}), session).result(60)
    )
    assert (after["isError"], text(after)) == (False, "echo: three"), after
    assert [line.split(" ", 2)[2] for line in hostile.calls() if line.startswith("echo ")] == [
        '{"text": "one"}',
        '{"text": "three"}',
    ]
