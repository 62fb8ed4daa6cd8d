"""Red-team of the early refusal's renewal (dispatcher.limits.refused_early lets one held
request go on per token of the agent's rate; harness_site.asgi.http_router holds the rest
up to EARLY_HOLD and marks the one it lets through in the ASGI scope). Each test is an
attack or a user's complaint, driven through the real ASGI application in-process, or a
real daphne; it passes when the attack fails."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
import redis
from asgiref.sync import async_to_sync
from django.conf import settings
from django.test import override_settings

from dispatcher import limits
from tests.redteam.test_request_threads_attacks import bearer, call, refuse, scope
from tests.support.factories import make_agent
from tests.support.live import LiveStack


def bucket_key(agent: Any) -> str:
    return ":".join([settings.HARNESS_LIMITS_PREFIX, "rate", limits.agent_key(agent)])


def timed(asgi: Any, request_scope: dict[str, Any]) -> tuple[int, float]:
    started = time.monotonic()
    status, _ = async_to_sync(call)(asgi.application, request_scope)
    return status, time.monotonic() - started


@pytest.mark.django_db(transaction=True)
@override_settings(HARNESS_AGENT_REQUESTS_PER_SECOND=0.05, HARNESS_AGENT_REQUEST_BURST=1)
def test_a_root_path_does_not_take_an_agent_api_request_past_the_router(
    asgi: Any, forgetting: None
) -> None:
    """daphne takes a request's root path from any client's `Daphne-Root-Path` header.
    The router looked at the path with the root path still on it: /x/api/v1/tools with a
    root path of /x was not the agent API to it (no early refusal held, and Django's own
    handler with the reviewer pages' middleware served it), yet Django strips the root
    path and serves the agent API. A refused agent got its 429s at once, as fast as it
    could ask, instead of one a second per connection."""
    fx = make_agent()
    plain = scope("/api/v1/tools", bearer(fx.token))
    assert async_to_sync(call)(asgi.application, dict(plain))[0] == 200
    assert async_to_sync(call)(asgi.application, dict(plain))[0] == 429  # remembered
    status, held = timed(asgi, dict(plain))
    assert status == 429 and held >= 0.9 * limits.EARLY_HOLD, (status, held)
    # (Since rtfresh, no client names a root path: harness_site.asgi.ServedAtTheRoot drops
    # it, so /x/api/v1/tools is no agent API at all, for any agent: a page not found.)
    rooted = {**scope("/x/api/v1/tools", bearer(fx.token)), "root_path": "/x"}
    assert async_to_sync(call)(asgi.application, rooted)[0] == 404
    other = make_agent()
    rooted = {**scope("/x/api/v1/tools", bearer(other.token)), "root_path": "/x"}
    assert async_to_sync(call)(asgi.application, rooted)[0] == 404


@pytest.mark.live
def test_live_a_daphne_root_path_header_does_not_skip_the_hold(
    live_stack: LiveStack, live_db: None
) -> None:
    """The same against a real daphne, whose root path any client sets by header. (The
    live stack runs at the default rate, 20 a second: its burst is spent first, and the
    refusal runs out within the hold.)"""
    fx = make_agent()
    with httpx.Client(base_url=live_stack.url, headers=fx.headers, timeout=30) as agent:
        for _ in range(100 * settings.HARNESS_AGENT_REQUEST_BURST):
            if agent.get("/api/v1/tools").status_code == 429:
                break
        else:
            pytest.fail("the agent's burst never ran out")
        started = time.monotonic()
        answer = agent.get("/x/api/v1/tools", headers={"Daphne-Root-Path": "/x"})
        held = time.monotonic() - started
    # (Since rtfresh the header names no root path: harness_site.asgi.ServedAtTheRoot.
    # /x/api/v1/tools is then no agent API, and never a 429 from memory at once.)
    assert answer.status_code == 404, (answer, held)


@pytest.mark.django_db(transaction=True)
@override_settings(HARNESS_AGENT_REQUESTS_PER_SECOND=0.5, HARNESS_AGENT_REQUEST_BURST=3)
def test_an_agent_refused_long_ago_is_served_its_whole_burst(asgi: Any, forgetting: None) -> None:
    """A refusal that ran out stayed in the memory for good (renewed by the next request,
    dropped only when a granted request left a token in the bucket). An agent refused
    once, an hour ago, then sends one request that never reaches the bucket (a path the
    API does not have) and, at once, two within its full bucket: the stray request was
    the one let through, the refusal was renewed for 1/rate (two seconds), and the two
    were held a second and refused 429 though the bucket held tokens for both."""
    fx = make_agent()
    tools = scope("/api/v1/tools", bearer(fx.token))
    statuses = [async_to_sync(call)(asgi.application, dict(tools))[0] for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    # An hour later: the bucket is full again and the refusal ran out long ago.
    redis.Redis.from_url(settings.REDIS_URL).delete(bucket_key(fx.agent))
    digest = limits._digest(fx.token)
    limits._refused_until[digest] = time.monotonic() - 3600

    async def stray_then_two() -> list[int]:
        stray = await call(asgi.application, scope("/api/v1/no-such-thing", bearer(fx.token)))
        answers = await asyncio.gather(*(call(asgi.application, dict(tools)) for _ in range(2)))
        return [stray[0], *(status for status, _ in answers)]

    assert async_to_sync(stray_then_two)() == [404, 200, 200]


@pytest.mark.django_db(transaction=True)
@override_settings(HARNESS_AGENT_REQUESTS_PER_SECOND=0.05, HARNESS_AGENT_REQUEST_BURST=1)
def test_the_let_through_mark_cannot_be_sent_by_a_client(asgi: Any, forgetting: None) -> None:
    """The mark the router puts in the scope of the one request it lets through is the
    scope's own key: a header, a query or a path of that name is not it, and a request
    carrying them is refused like any other (a 429 from memory, no request admitted)."""
    fx = make_agent()
    tools = scope("/api/v1/tools", bearer(fx.token))
    assert async_to_sync(call)(asgi.application, dict(tools))[0] == 200
    assert async_to_sync(call)(asgi.application, dict(tools))[0] == 429
    name = limits._LET_THROUGH.encode()
    for forged in [
        scope("/api/v1/tools", bearer(fx.token), (name, b"1")),
        scope("/api/v1/tools", bearer(fx.token), (b"harness-rate-let-through", b"1")),
        scope(f"/api/v1/tools?{limits._LET_THROUGH}=1", bearer(fx.token)),
        scope("/mcp/", bearer(fx.token), (name, b"1"), method="POST"),
    ]:
        assert async_to_sync(call)(asgi.application, forged)[0] == 429
    tokens = float(
        redis.Redis.from_url(settings.REDIS_URL).hget(bucket_key(fx.agent), "tokens") or 0
    )
    assert tokens > -2, tokens  # only the one refusal counted: the forged ones never got there


@pytest.mark.django_db(transaction=True)
@override_settings(HARNESS_AGENT_REQUESTS_PER_SECOND=10, HARNESS_AGENT_REQUEST_BURST=1)
def test_a_flood_on_both_gateways_gets_no_more_than_the_rate(asgi: Any, forgetting: None) -> None:
    """An agent floods the agent API and the MCP gateway at once, its requests held
    together: what goes on past the bucket is what the rate gives over the hold, however
    the requests are split between the gateways and whichever was let through."""
    fx = make_agent()
    tools = scope("/api/v1/tools", bearer(fx.token))
    mcp = scope(
        "/mcp/",
        bearer(fx.token),
        (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream"),
        method="POST",
    )
    assert async_to_sync(call)(asgi.application, dict(tools))[0] == 200
    refuse(asgi.application, tools)
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}'

    async def flood() -> list[int]:
        requests = [call(asgi.application, dict(tools)) for _ in range(15)]
        requests += [call(asgi.application, dict(mcp), body) for _ in range(15)]
        started = time.monotonic()
        answers = await asyncio.gather(*requests)
        assert time.monotonic() - started < limits.EARLY_HOLD + 5
        return [status for status, _ in answers]

    statuses = async_to_sync(flood)()
    past_the_bucket = len(statuses) - statuses.count(429)
    assert past_the_bucket <= 1 + 10 * limits.EARLY_HOLD + 1, statuses
    assert not [s for s in statuses if s >= 500], statuses


@pytest.mark.django_db(transaction=True)
@override_settings(HARNESS_AGENT_REQUESTS_PER_SECOND=20, HARNESS_AGENT_REQUEST_BURST=1)
def test_a_refused_agents_held_flood_does_not_hold_another_agent(
    asgi: Any, forgetting: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agent A, refused, floods with 500 requests held at once (each wakes at every
    renewal of A's refusal, 20 a second); agent B's requests meanwhile are neither
    refused nor held: B's token is not A's, and waking A's held requests is cheap."""
    # (A's requests held 5 s, not 1: B's bound below is half of it, and on a loaded host
    # the loop starting A's 500 and waking them twenty times a second answered B's first
    # in 1.5 s; held behind A's, B would wait the 5 s)
    monkeypatch.setattr(limits, "EARLY_HOLD", 5.0)
    a, b = make_agent(), make_agent()
    tools = scope("/api/v1/tools", bearer(a.token))
    assert async_to_sync(call)(asgi.application, dict(tools))[0] == 200
    refuse(asgi.application, tools)
    held_started = asyncio.Event()
    b_answers: list[tuple[int, float]] = []

    async def b_calls() -> None:
        await held_started.wait()
        await asyncio.sleep(0)  # (every one of A's requests is held by now)
        for _ in range(3):
            started = time.monotonic()
            status, _ = await call(asgi.application, scope("/api/v1/tools", bearer(b.token)))
            b_answers.append((status, time.monotonic() - started))
            await asyncio.sleep(0.1)  # (within B's own rate)

    async def a_call() -> int:
        held_started.set()
        return (await call(asgi.application, dict(tools)))[0]

    async def scenario() -> list[int]:
        b_task = asyncio.ensure_future(b_calls())
        answers = await asyncio.gather(*(a_call() for _ in range(500)))
        await b_task
        return answers

    a_statuses = async_to_sync(scenario)()
    let_through = a_statuses.count(200)  # (one a renewal, 20 a second, while they are held)
    assert set(a_statuses) <= {200, 429} and let_through <= 1 + 20 * limits.EARLY_HOLD + 1
    assert [status for status, _ in b_answers] == [200, 200, 200], b_answers
    assert all(seconds < 0.5 * limits.EARLY_HOLD for _, seconds in b_answers), b_answers


@pytest.mark.django_db(transaction=True)
@override_settings(HARNESS_AGENT_REQUESTS_PER_SECOND=0.05, HARNESS_AGENT_REQUEST_BURST=1)
def test_an_mcp_request_without_a_bearer_token_does_not_touch_the_refusal(
    asgi: Any, forgetting: None
) -> None:
    """The router reads a refused token only from a Bearer header; the MCP gateway read the
    memory for whatever followed the scheme. `Authorization: Basic <refused token>` was
    then answered 429 at once (never held: a flood of them is answered as fast as the
    process can), and, when the refusal ran out, took the one request let through and
    renewed the refusal for 1/rate (20 s here) without reaching the bucket: the agent's
    next request, with a full bucket, was held and refused."""
    fx = make_agent()
    tools = scope("/api/v1/tools", bearer(fx.token))
    assert async_to_sync(call)(asgi.application, dict(tools))[0] == 200
    assert async_to_sync(call)(asgi.application, dict(tools))[0] == 429
    basic = scope(
        "/mcp/",
        (b"authorization", b"Basic " + fx.token.encode()),
        (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream"),
        method="POST",
    )
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}'
    assert async_to_sync(call)(asgi.application, dict(basic), body)[0] == 401
    # The refusal has just run out and the bucket has its token again.
    redis.Redis.from_url(settings.REDIS_URL).delete(bucket_key(fx.agent))
    limits._refused_until[limits._digest(fx.token)] = time.monotonic()
    assert async_to_sync(call)(asgi.application, dict(basic), body)[0] == 401
    assert async_to_sync(call)(asgi.application, dict(tools))[0] == 200
