"""Red-team of the inline path (an auto-allowed upstream HTTP MCP server's call run by the
daphne request that admitted it, on that request's event loop) against a REAL daphne: the
live stack (tests/conftest.py `live_stack`, HARNESS_DB_POOL_MAX=6) and a hostile upstream
server process (tests/support/mcp_hostile_upstream.py). The attacks of
tests/redteam/test_inline_wake_attacks.py and test_inline_loop_attacks.py ran on an
in-process serving loop; these are the same attacks through daphne's own HTTP server,
sockets, disconnects and threads. Each passes when the attack fails."""

from __future__ import annotations

import json
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings

from audit.models import AuditEvent
from dispatcher import limits, wakeups
from dispatcher.gateways.mcp import TOO_MANY_WAITS
from dispatcher.gateways.mcp_http import split_session_id
from dispatcher.models import AgentSession, Status, ToolCall
from tests.dispatcher.test_running_notice import session_news
from tests.mcp.test_fast_path import Answer, call
from tests.redteam import test_inline_loop_attacks as loop_attacks
from tests.redteam.test_inline_loop_attacks import DB_MARGIN, Hostile
from tests.support.factories import AgentFixture, make_agent
from tests.support.live import LiveStack
from tests.support.mcp_requests import HANDSHAKE, initialize

pytestmark = pytest.mark.live

hostile = loop_attacks.hostile  # (a hostile upstream server process, loopback)


def register(url: str, timeout: float) -> str:
    """The hostile server registered with a fresh name, trusted, `timeout` s a call."""
    return loop_attacks.register(url, timeout=timeout)


def post(
    stack: LiveStack, fx: AgentFixture, body: Any, session: str = "", read: float = 60
) -> Answer:
    """One POST /mcp/ on a connection of its own (closed when it ends: a read timeout is
    the client hanging up)."""
    headers = {
        "authorization": f"Bearer {fx.token}",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        **({"mcp-session-id": session, "mcp-protocol-version": HANDSHAKE} if session else {}),
    }
    with httpx.Client(timeout=httpx.Timeout(10, read=read)) as client:
        response = client.post(stack.url + "/mcp/", content=json.dumps(body), headers=headers)
        return Answer(response.status_code, dict(response.headers), response.content, False)


def open_session(stack: LiveStack, fx: AgentFixture) -> str:
    answer = post(stack, fx, initialize("rtdaphne", run=uuid.uuid4().hex))
    assert answer.status == 200, answer.body[:300]
    return answer.headers["mcp-session-id"]


def result_of(answer: Answer) -> dict[str, Any]:
    assert answer.status == 200, answer.body[:500]
    [message] = answer.messages()
    assert "result" in message, message
    result: dict[str, Any] = message["result"]
    return result


def text(result: dict[str, Any]) -> str:
    return " ".join(block.get("text", "") for block in result["content"])


def stored(session: str, tool: str) -> ToolCall:
    return ToolCall.objects.get(session__external_id=split_session_id(session)[0], name=tool)


def arrived(hostile: Hostile, tool: str) -> list[float]:
    """When each call of `tool` reached the server (Unix time)."""
    return [float(line.split()[1]) for line in hostile.calls() if line.split()[0] == tool]


def wait_for_calls(hostile: Hostile, count: int, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while len(hostile.calls()) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(hostile.calls()) >= count, hostile.calls()


# --- 1. A call sent beside two `never` calls of its server ---------------------------------


def test_a_call_beside_two_never_calls_of_its_server_is_answered_at_once(
    live_stack: LiveStack, live_db: None, hostile: Hostile
) -> None:
    """Three agents, one server's shared session in daphne: A's `never`, then B's, then
    (T/2 later) C's echo. C's echo is sent at once and answered while A's and B's still
    hang (calls are in flight on one session side by side, upstream.HTTP_IN_FLIGHT), sent
    once; A and B are answered timed out, each sent once. Before, one request at a time
    per session: C waited behind both and was answered late, or timed out unsent."""
    timeout = 5.0
    name = register(hostile.url, timeout)
    a, b, c = (make_agent(mode="trusted") for _ in range(3))
    sessions = [open_session(live_stack, fx) for fx in (a, b, c)]
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(post, live_stack, a, call(1, f"{name}__never", {}), sessions[0])
        wait_for_calls(hostile, 1)
        second = pool.submit(post, live_stack, b, call(1, f"{name}__never", {}), sessions[1])
        wait_for_calls(hostile, 2)
        started = time.monotonic()
        echo = result_of(
            post(live_stack, c, call(1, f"{name}__echo", {"text": "now"}), sessions[2])
        )
        took = time.monotonic() - started
        hung_meanwhile = not first.done() and not second.done()
        held = [result_of(f.result(60)) for f in (first, second)]
    assert all(r["isError"] and "did not finish within" in text(r) for r in held), held
    assert (text(echo), echo["isError"]) == ("echo: now", False), echo
    assert hung_meanwhile, f"the echo was answered only once the hung calls ended ({took:.2f}s)"
    assert stored(sessions[2], f"{name}__echo").status == Status.COMPLETED
    assert [line.split()[0] for line in hostile.calls()] == ["never", "never", "echo"]


# --- 2. A hung inline call -------------------------------------------------------------------


def test_a_hung_inline_call_times_out_with_its_events_and_wake_ups(
    live_stack: LiveStack, live_db: None, hostile: Hostile
) -> None:
    # (6 s, not 2 s: the request sent again is answered well under one timeout, which a
    # run again would take; under 1 s of 2 s a loaded host's database trips could outlast)
    timeout = 6.0
    name = register(hostile.url, timeout)
    fx = make_agent(mode="trusted")
    session = open_session(live_stack, fx)
    pk = AgentSession.objects.get(external_id=split_session_id(session)[0]).pk
    pubsub = redis.Redis.from_url(settings.REDIS_URL).pubsub()
    pubsub.subscribe(wakeups.session_channel(str(pk)))
    assert pubsub.get_message(timeout=30)["type"] == "subscribe"  # (its confirmation)
    started = time.monotonic()
    answer = result_of(post(live_stack, fx, call(1, f"{name}__never", {}), session))
    took = time.monotonic() - started
    news = session_news(pubsub, 0.5)
    pubsub.close()
    row = stored(session, f"{name}__never")
    assert answer["isError"] is True and f"did not finish within its {timeout:g} s" in text(
        answer
    ), answer
    assert timeout <= took < timeout + 1 + DB_MARGIN, took
    assert row.status == Status.TIMED_OUT, row.status
    events = list(AuditEvent.objects.filter(subject=f"call:{row.pk}").order_by("id"))
    kinds = [e.kind for e in events]
    assert kinds == ["call.received", "call.allowed", "call.started", "call.timed_out"], kinds
    assert events[2].actor == "inline", events[2].actor
    assert news == [f"{row.pk} running", f"{row.pk} timed_out"], news
    # The same request sent again is answered with that outcome at once, not run again.
    started = time.monotonic()
    again = result_of(post(live_stack, fx, call(1, f"{name}__never", {}), session))
    assert text(again) == text(answer) and time.monotonic() - started < timeout / 2, again
    assert len(arrived(hostile, "never")) == 1, hostile.calls()


# --- 3. A client that hangs up, and the same request id again ------------------------------


def test_a_client_that_hangs_up_then_sends_the_same_id_again_gets_the_one_runs_result(
    live_stack: LiveStack, live_db: None, hostile: Hostile
) -> None:
    name = register(hostile.url, 5.0)
    fx = make_agent(mode="trusted")
    session = open_session(live_stack, fx)
    body = call(7, f"{name}__sleep", {"seconds": 1.5})
    with pytest.raises(httpx.ReadTimeout):  # the client hangs up mid call
        post(live_stack, fx, body, session, read=0.5)
    wait_for_calls(hostile, 1)
    again = result_of(post(live_stack, fx, body, session))
    assert text(again) == "slept 1.5" and again["isError"] is False, again
    time.sleep(0.5)
    assert [line.split()[0] for line in hostile.calls()] == ["sleep"], hostile.calls()
    assert stored(session, f"{name}__sleep").status == Status.COMPLETED


def test_the_same_id_sent_while_the_first_runs_and_the_first_hangs_up(
    live_stack: LiveStack, live_db: None, hostile: Hostile
) -> None:
    name = register(hostile.url, 5.0)
    fx = make_agent(mode="trusted")
    session = open_session(live_stack, fx)
    body = call(8, f"{name}__sleep", {"seconds": 1.5})
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, live_stack, fx, body, session, 0.8)
        wait_for_calls(hostile, 1)
        second = pool.submit(post, live_stack, fx, body, session)
        with pytest.raises(httpx.ReadTimeout):
            first.result(30)
        again = result_of(second.result(30))
    assert text(again) == "slept 1.5" and again["isError"] is False, again
    time.sleep(0.5)
    assert [line.split()[0] for line in hostile.calls()] == ["sleep"], hostile.calls()
    assert stored(session, f"{name}__sleep").status == Status.COMPLETED


# --- 4. Many agents at once; a server that answers garbage ----------------------------------


def test_many_agents_inline_at_once_on_separate_servers_beyond_the_db_pool(
    live_stack: LiveStack, live_db: None, hostile: Hostile
) -> None:
    """Twelve agents (twice HARNESS_DB_POOL_MAX) each call a slow tool of a server of their
    own at once: each holds a request and its ORM thread while its upstream answers. All
    twelve reach the server while every one of them is held there (side by side, not one
    after another, not a pool timeout), a thirteenth agent's quick call meanwhile is
    answered, and then all twelve are answered with their result.

    (The slow calls are held by the server until the quick one is answered, not trusted to
    take 2 s: on a loaded host 2 s ended before the twelve had all arrived.)"""
    count, sleep = 12, 0.2
    names = [register(hostile.url, 90.0) for _ in range(count + 1)]
    agents = [make_agent(mode="trusted") for _ in range(count + 1)]
    sessions = [open_session(live_stack, fx) for fx in agents]
    hold = Path(f"{hostile.calls_file}.sleep-hold")
    hold.touch()
    with ThreadPoolExecutor(count + 1) as pool:
        slow: list[Future[Answer]] = [
            pool.submit(post, live_stack, fx, call(1, f"{n}__sleep", {"seconds": sleep}), s)
            for fx, n, s in zip(agents[:count], names[:count], sessions[:count], strict=True)
        ]
        # Side by side: a call one after another (or waiting for a database connection
        # another held call keeps) would not reach the server while the first is held.
        wait_for_calls(hostile, count, 60)
        quick = result_of(
            post(
                live_stack,
                agents[-1],
                call(1, f"{names[-1]}__echo", {"text": "quick"}),
                sessions[-1],
            )
        )
        # Not queued behind the slow calls: answered while every one of them is held.
        held_meanwhile = not any(f.done() for f in slow)
        hold.unlink()
        results = [result_of(f.result(60)) for f in slow]
    assert text(quick) == "echo: quick" and held_meanwhile, quick
    assert [text(r) for r in results] == [f"slept {sleep}"] * count, results
    assert sorted(line.split()[0] for line in hostile.calls()) == ["echo"] + ["sleep"] * count


@pytest.mark.parametrize("tool", ["garbage", "close"])
def test_a_broken_answer_fails_the_call_at_once_and_the_server_still_serves(
    live_stack: LiveStack, live_db: None, hostile: Hostile, tool: str
) -> None:
    """An upstream that answers bytes that are no JSON, or closes mid answer: the call is
    answered at once (not at its timeout) with an error the model reads, stored so, sent
    once; the next call of the server is served."""
    timeout = 30.0  # (long: "at once" is well under it even on a loaded host)
    name = register(hostile.url, timeout)
    fx = make_agent(mode="trusted")
    session = open_session(live_stack, fx)
    started = time.monotonic()
    broken = result_of(post(live_stack, fx, call(1, f"{name}__{tool}", {}), session))
    took = time.monotonic() - started
    echo = result_of(post(live_stack, fx, call(2, f"{name}__echo", {"text": "after"}), session))
    assert broken["isError"] is True and f"The MCP server '{name}'" in text(broken), broken
    assert took < timeout / 3, took
    row = stored(session, f"{name}__{tool}")
    assert (row.status, row.attempts, row.is_error) == (Status.COMPLETED, 1, True)
    assert text(echo) == "echo: after", echo
    assert [line.split()[0] for line in hostile.calls()] == [tool, "echo"], hostile.calls()


def test_a_trickling_answer_is_cut_at_the_timeout_and_its_connection_closed(
    live_stack: LiveStack, live_db: None, hostile: Hostile
) -> None:
    """An upstream sends its answer's headers, then a byte every 0.2 s, never the end (each
    read comes in time, so no read timeout fires). The agent is answered as timed out at
    the tool's timeout (+1 s backstop), and daphne closes that connection soon after
    (nothing left streaming into a forgotten call on the serving loop)."""
    timeout = 2.0
    name = register(hostile.url, timeout)
    fx = make_agent(mode="trusted")
    session = open_session(live_stack, fx)
    started, sent = time.monotonic(), time.time()
    answer = result_of(post(live_stack, fx, call(1, f"{name}__trickle", {}), session))
    took = time.monotonic() - started
    assert answer["isError"] is True and "did not finish within" in text(answer), answer
    assert took < timeout + 1 + DB_MARGIN, took
    assert stored(session, f"{name}__trickle").status == Status.TIMED_OUT
    deadline = time.monotonic() + 8
    while not arrived(hostile, "trickle-closed") and time.monotonic() < deadline:
        time.sleep(0.1)
    closed = arrived(hostile, "trickle-closed")
    assert closed and closed[0] - sent < timeout + 6, (closed, sent, hostile.calls())
    echo = result_of(post(live_stack, fx, call(2, f"{name}__echo", {"text": "after"}), session))
    assert text(echo) == "echo: after", echo


def test_hung_inline_calls_hold_no_thread_and_others_are_answered_meanwhile(
    live_stack: LiveStack, live_db: None, hostile: Hostile
) -> None:
    """Five agents send eight calls each (their wait slots' limit) of a server that never
    answers, at once: 40 requests, more than daphne's 32 ORM threads (mcp.ORM_THREADS).
    An inline call is awaited on its request's loop, holding no thread while it waits
    (for its server: all 40 are in flight on the server's one session), so a bystander's call
    of another server is answered while all 40 still wait, not a timeout later (before,
    the 32 held every thread). Every one of the 40 is then answered as timed out within
    one timeout (none refused as 'broke twice', none a 500 or a pool error, none waiting
    a second timeout for a thread), and none is sent after it was answered.

    (Timed by the defect's own measure, two timeouts, not one plus a margin: a loaded host
    took 17 s to answer all 40 of an 8 s timeout with no thread waited for.)"""
    timeout = 12.0
    name = register(hostile.url, timeout)
    other = register(hostile.url, timeout)
    agents = [make_agent(mode="trusted") for _ in range(5)]
    sessions = [open_session(live_stack, fx) for fx in agents]
    bystander = make_agent(mode="trusted")
    bystander_session = open_session(live_stack, bystander)
    with ThreadPoolExecutor(40) as pool:
        started = time.monotonic()
        held = [
            pool.submit(post, live_stack, fx, call(i, f"{name}__never", {}), s)
            for fx, s in zip(agents, sessions, strict=True)
            for i in range(8)
        ]
        wait_for_calls(hostile, 1)  # (the first of the 40 reached the server)
        waiting = ToolCall.objects.filter(name=f"{name}__never", status=Status.RUNNING)
        deadline = time.monotonic() + timeout / 2
        while waiting.count() < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
        admitted = waiting.count()
        echo = result_of(
            post(live_stack, bystander, call(1, f"{other}__echo", {"text": "x"}), bystander_session)
        )
        answered_meanwhile = [f for f in held if f.done()]
        answers = [result_of(f.result(60)) for f in held]
        took = time.monotonic() - started
    answered = time.time()
    assert admitted == 40, admitted  # (all 40 running at once: none waits for a thread)
    assert text(echo) == "echo: x" and not answered_meanwhile, (echo, len(answered_meanwhile))
    assert all("did not finish within" in text(a) for a in answers), {
        text(a)[:100] for a in answers
    }
    assert took < 2 * timeout, took
    statuses = set(ToolCall.objects.filter(name=f"{name}__never").values_list("status", flat=True))
    assert statuses == {Status.TIMED_OUT}, statuses
    time.sleep(1.5)
    nevers = arrived(hostile, "never")
    assert len(nevers) == 40 and all(t < answered for t in nevers), hostile.calls()


def test_requests_daphne_cancels_after_their_client_left_keep_their_slots_and_calls(
    live_stack: LiveStack, live_db: None, hostile: Hostile
) -> None:
    """daphne cancels a request's application 10 s (application_close_timeout) after its
    client hung up, while the inline call the request admitted still runs.

    The call still ends as it would have: agent B's `sleep` is sent once, its result
    stored, and the same request sent again is answered with it.

    And an agent holds at most HARNESS_MAX_WAITS_PER_AGENT (8) calls at once: an inline
    call holds its request's slot (and one of daphne's 32 ORM threads) until it ends.
    Agent A's eight calls of a server that never answers (15 s timeout), on which its
    client hangs up, keep their slots past daphne's cancellation: a ninth call then is
    refused (too many waits), not admitted beside the eight (else one agent, hanging up
    and sending again every 10 s, holds every ORM thread of the process)."""
    name = register(hostile.url, 15.0)
    other = register(hostile.url, 15.0)
    slow = register(hostile.url, 15.0)
    a, b = make_agent(mode="trusted"), make_agent(mode="trusted")
    session, b_session = open_session(live_stack, a), open_session(live_stack, b)
    b_body = call(9, f"{slow}__sleep", {"seconds": 11.5})
    with ThreadPoolExecutor(9) as pool:
        hung = [
            pool.submit(post, live_stack, a, call(i, f"{name}__never", {}), session, 0.5)
            for i in range(8)
        ]
        hung.append(pool.submit(post, live_stack, b, b_body, b_session, 0.5))
        for future in hung:
            with pytest.raises(httpx.ReadTimeout):
                future.result(30)
    deadline = time.monotonic() + 30  # (each hung-up request takes its slot on a loaded host)
    while limits.waits_held(a.agent) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert limits.waits_held(a.agent) == 8
    time.sleep(11.5)  # daphne's application_close_timeout (10 s) and its checker's second
    held = limits.waits_held(a.agent)
    ninth = post(live_stack, a, call(9, f"{other}__echo", {"text": "ninth"}), session)
    [message] = ninth.messages()
    running = ToolCall.objects.filter(name=f"{name}__never", status=Status.RUNNING).count()
    again = result_of(post(live_stack, b, b_body, b_session))
    log = (live_stack.log_dir / "daphne.log").read_text(errors="replace")
    assert "took too long to shut down and was killed" in log  # (the attack's premise)
    assert running > 0  # (A's calls still run: the attack's premise)
    assert (held, message.get("error", {}).get("code")) == (8, TOO_MANY_WAITS), (held, message)
    row = stored(b_session, f"{slow}__sleep")
    assert (row.status, text(again)) == (Status.COMPLETED, "slept 11.5"), (row.status, again)
    assert arrived(hostile, "sleep") and len(arrived(hostile, "sleep")) == 1, hostile.calls()
