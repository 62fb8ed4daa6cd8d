"""Red-team of 562d831: an inline call's admission wakes nobody (its body is announced
running only if still running pipeline.RUNNING_NOTICE_AFTER later, then its result), and
upstream.Pool._call answers a call that waited past its timeout TimeoutError even when
the connection it waited on was replaced meanwhile. Driven through the real gateway on a
serving loop (tests/redteam/test_inline_loop_attacks.py) against a real hostile upstream
server process (tests/support/mcp_hostile_upstream.py).

One defect found and fixed with them (older than 562d831): a call queued behind two calls
of a server that never answers, each of which timed out and replaced the shared session,
was answered "its connection broke twice while the call waited" (an error, not sent)
while it still had time left; the session it then would have used was a new one. A
connection replaced because a call ahead of it failed is not a broken one: the call goes
on to the replacement while its time lasts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from dispatcher import wakeups
from dispatcher.gateways.mcp_http import split_session_id
from dispatcher.models import AgentSession, Status, ToolCall
from dispatcher.tools.base import ExecutionContext
from dispatcher.tools.sources import upstream
from tests.dispatcher.test_running_notice import session_news
from tests.mcp.test_fast_path import call
from tests.redteam import test_inline_loop_attacks as loop_attacks
from tests.redteam.test_inline_loop_attacks import (
    DB_MARGIN,
    Hostile,
    ServingLoop,
    result_of,
    stored,
)
from tests.support.factories import make_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]

# (the attacks' fixtures: a hostile upstream server process, and a serving loop as daphne's)
hostile = loop_attacks.hostile
serving = loop_attacks.serving


def register(url: str, timeout: float) -> str:
    """The hostile server registered with a fresh name, trusted, `timeout` s a call."""
    return loop_attacks.register(url, timeout=timeout)


def test_a_call_with_time_left_behind_two_timed_out_calls_is_sent_not_refused(
    hostile: Hostile, serving: ServingLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three agents share one server's session on the serving loop, one request at a
    time (here upstream.HTTP_IN_FLIGHT is 1: the queue of a session whose turns are all
    taken). A's `never` holds it for its whole timeout T and replaces it; B's `never`, which
    queued behind A since 3 s after A was sent, goes to the new session with the 3 s it
    has left, less the new session's start (its read is cut at its own deadline + 1 s),
    and replaces that one too. C's echo, queued behind both since 6 s after B started
    (before A is cut), still has about 5 s when B is cut: it must be sent on the third
    session and answered, not refused as 'its connection broke twice' (nothing broke: two
    calls ahead of it timed out).

    (B queued only 0.2 s after A once: B then had that 0.2 s less the new session's start
    when A was cut, about 20 ms on a quiet machine, and in CI none, so B was rightly not
    sent, as a call whose time ran out while it waited: the server saw never, echo. With
    T = 8 s and C 3 s after B, C had 2 s left, which a loaded host's session start and
    database trips may use up: T is 12 s now, and C waits for B to be running.)"""
    monkeypatch.setattr(upstream, "HTTP_IN_FLIGHT", 1)
    timeout = 12.0
    name = register(hostile.url, timeout)
    a, b, c = (make_agent(mode="trusted") for _ in range(3))
    sessions = [serving.session(fx) for fx in (a, b, c)]
    first = serving.post(a, call(1, f"{name}__never", {}), sessions[0])
    deadline = time.monotonic() + 30
    while not hostile.calls() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert hostile.calls(), "the first call did not reach the server"
    time.sleep(3)
    second = serving.post(b, call(1, f"{name}__never", {}), sessions[1])
    b_calls = ToolCall.objects.filter(name=f"{name}__never", status=Status.RUNNING)
    while b_calls.count() < 2 and time.monotonic() < deadline + 30:
        time.sleep(0.02)
    assert b_calls.count() == 2, "B's call is not running (waiting its turn)"
    time.sleep(6)
    started = time.monotonic()
    third = serving.post(c, call(1, f"{name}__echo", {"text": "late"}), sessions[2])
    echo = result_of(third.result(60))
    took = time.monotonic() - started
    behind = result_of(second.result(60))
    first.result(60)
    row = stored(sessions[2], f"{name}__echo")
    sent = [line.split()[0] for line in hostile.calls()]
    assert (row.status, echo["content"]) == (
        Status.COMPLETED,
        [{"type": "text", "text": "echo: late"}],
    ), (row.status, echo, took, sent)
    assert took < timeout + 1 + DB_MARGIN, took
    assert sent == ["never", "never", "echo"], (sent, behind)


def test_a_hung_inline_call_is_announced_running_then_timed_out_in_order(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """An inline call whose server never answers: its session hears it running (the
    admission said nothing), then timed out at its host-only timeout, in that order, and
    nothing else; the request is answered then."""
    timeout = 2.0
    name = register(hostile.url, timeout)
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    pk = AgentSession.objects.get(external_id=split_session_id(session)[0]).pk
    pubsub = redis.Redis.from_url(settings.REDIS_URL).pubsub()
    pubsub.subscribe(wakeups.session_channel(str(pk)))
    assert pubsub.get_message(timeout=30)["type"] == "subscribe"  # (its confirmation)
    started = time.monotonic()
    request = serving.post(fx, call(1, f"{name}__never", {}), session)
    answer = result_of(request.result(60))
    took = time.monotonic() - started
    news = session_news(pubsub, 0.5)  # (what was published meanwhile, and after)
    pubsub.close()
    row = stored(session, f"{name}__never")
    assert row.status == Status.TIMED_OUT and answer["isError"] is True
    assert news == [f"{row.pk} running", f"{row.pk} timed_out"], news
    assert took < timeout + 1 + DB_MARGIN, took


def test_a_second_request_with_the_same_id_waits_for_the_inline_runs_result(
    hostile: Hostile, serving: ServingLoop
) -> None:
    """The client sends the same tools/call again (same id, same session) while the first
    runs inline: the second request finds the running call and is answered with its
    result as soon as it is written (the result's wake-up), not at the next progress
    interval; the server ran it once."""
    name = register(hostile.url, 5.0)
    fx = make_agent(mode="trusted")
    session = serving.session(fx)
    body: Any = call(7, f"{name}__sleep", {"seconds": 1.5})
    first = serving.post(fx, body, session)
    deadline = time.monotonic() + 10
    while not hostile.calls() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert hostile.calls(), "the call did not reach the server"
    again = serving.post(fx, body, session)
    one = result_of(first.result(60))
    done = time.monotonic()
    two = result_of(again.result(60))
    late = time.monotonic() - done
    assert one["content"] == two["content"] == [{"type": "text", "text": "slept 1.5"}]
    # (well under the interval, 10 s, at which it would be answered otherwise: 0.5 s once,
    # which a loaded host's database trips could take)
    assert late < settings.HARNESS_MCP_PROGRESS_INTERVAL / 5, late
    assert [line.split()[0] for line in hostile.calls()] == ["sleep"]


def test_an_upstream_call_made_past_its_calls_deadline_is_not_sent(
    hostile: Hostile, tmp_path: Path
) -> None:
    """The call's deadline is its host's (pipeline.execute sets it as the body starts),
    not one taken again when the upstream is called: a body that reaches the upstream
    only after it (here: a wrapper that took the whole timeout) sends nothing, and its
    agent, told it timed out, may send it again without it running twice."""
    endpoint = upstream.Endpoint(
        server_id=8_000_001, version=1, name="late", transport="http", url=hostile.url, timeout=5
    )
    [echo] = [d for d in upstream.list_definitions(endpoint) if d.name == "echo"]
    ctx = ExecutionContext(
        workspace=tmp_path,
        call_id="late",
        timeout=5,
        output_limit=4000,
        deadline=time.monotonic() - 0.1,
    )
    with pytest.raises(TimeoutError):
        upstream.execute(endpoint, "echo", echo.fingerprint, ctx, {"text": "late"})
    assert not [line for line in hostile.calls() if line.startswith("echo ")], hostile.calls()
