"""No input freezes the web process: while daphne admits a hostile message or holds many
waiting requests, another request is still answered within a second."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings

from audit.models import AuditEvent
from dispatcher import wakeups
from dispatcher.models import ToolCall
from tests.support.factories import AgentFixture, make_agent
from tests.support.live import LiveStack

pytestmark = pytest.mark.live

ANSWER_WITHIN = 1.0  # seconds, on an idle machine
# On a loaded machine (another `make test` beside this one) the bound grows with the answer
# time measured just before the attack: a frozen loop is held for the whole admission
# (tens of seconds when it froze), far past either.
LOADED_FACTOR = 20
# After a session's first wait subscribed, the time given to the waits sent with it.
SETTLE = 0.5  # seconds
# The largest argument a body under HARNESS_MAX_BODY_BYTES can carry.
MEGABYTE = 1_000_000 - 200


def start(client: httpx.Client) -> dict[str, Any]:
    response = client.post("/api/v1/sessions", json={"title": "freeze"})
    assert response.status_code == 201, response.text
    return response.json()


def pending_call(client: httpx.Client, session: dict[str, Any], n: int) -> str:
    """A call that asks a reviewer (standard mode: writes ask), so it stays pending."""
    body = {
        "calls": [
            {"id": f"w{n}", "name": "write_file", "arguments": {"path": f"f{n}", "content": "x"}}
        ]
    }
    response = client.post(f"/api/v1/sessions/{session['id']}/calls", json=body)
    assert response.json()["calls"][0]["status"] == "pending_approval", response.text
    return str(response.json()["calls"][0]["id"])


def answer_times(client: httpx.Client, call_id: str, until: threading.Event) -> list[float]:
    """How long another agent's ordinary request (its call, read back) takes, again and
    again, until `until` is set."""
    times = []
    while not until.is_set() or not times:
        began = time.monotonic()
        response = client.get(f"/api/v1/calls/{call_id}")
        times.append(time.monotonic() - began)
        assert response.status_code == 200, response.text
        time.sleep(0.02)
    return times


@pytest.mark.parametrize(
    "argument",
    [
        ("token-" * 1366)[:8192],  # 8 KB: cubic regex backtracking before
        ("token-" * (MEGABYTE // 6 + 1))[:MEGABYTE],
        ("=:-_. ,;&|/" * (MEGABYTE // 11 + 1))[:MEGABYTE],  # separators
    ],
    ids=["8KB token-token", "1MB token-token", "1MB separators"],
)
def test_a_hostile_argument_leaves_the_server_answering(
    live_stack: LiveStack, live_db: None, argument: str
) -> None:
    attacker = make_agent(mode="locked")  # an unknown tool in locked mode is enough
    probe = live_stack.client(make_agent(mode="standard"), timeout=120)
    call_id = pending_call(probe, start(probe), 0)
    idle = threading.Event()
    idle.set()
    before = sorted(answer_times(probe, call_id, idle) for _ in range(9))
    bound = max(ANSWER_WITHIN, LOADED_FACTOR * before[4][0])
    done = threading.Event()
    result: dict[str, Any] = {}

    def attack() -> None:
        with live_stack.client(attacker, timeout=120) as client:
            session = start(client)
            body = {"calls": [{"id": "x", "name": "no_such_tool", "arguments": {"a": argument}}]}
            began = time.monotonic()
            result["response"] = client.post(
                f"/api/v1/sessions/{session['id']}/calls", content=json.dumps(body)
            )
            result["seconds"] = time.monotonic() - began
            done.set()

    thread = threading.Thread(target=attack)
    thread.start()
    try:
        times = answer_times(probe, call_id, done)
    finally:
        done.set()
        thread.join(120)
        probe.close()
    response = result["response"]
    assert response.status_code == 200, response.text
    assert response.json()["calls"][0]["status"] == "rejected"
    assert max(times) < bound, (max(times), bound, result["seconds"])
    received = AuditEvent.objects.get(
        subject=f"call:{response.json()['calls'][0]['id']}", kind="call.received"
    )
    assert len(received.payload["arguments"]) >= len(argument)  # logged whole, not cut


def subscribed(session: dict[str, Any]) -> bool:
    """Whether a server process listens on the session's wake-up channel."""
    channel = wakeups.session_channel(session["id"])
    [(_, count)] = redis.Redis.from_url(settings.REDIS_URL).pubsub_numsub(channel)
    return bool(count)


def wake_clients() -> list[dict[str, Any]]:
    """The wake hubs of this run's processes: those on its Redis database (another test run
    on this Redis server, such as another pytest-xdist worker, has a database of its own)."""
    server = redis.Redis.from_url(settings.REDIS_URL)
    db = str(server.connection_pool.connection_kwargs.get("db", 0))
    return [
        c
        for c in server.client_list()
        if str(c.get("name", "")).startswith("harness-wake-") and c.get("db") == db
    ]


async def hold_waits(
    stack: LiveStack, agents: list[AgentFixture], calls: dict[str, list[str]], seconds: float
) -> list[httpx.Response]:
    """Every agent waits on each of its pending calls at once."""
    clients = [httpx.AsyncClient(base_url=stack.url, headers=a.headers, timeout=60) for a in agents]
    try:
        return await asyncio.gather(
            *[
                client.get(f"/api/v1/calls/{call_id}", params={"wait": seconds})
                for client, agent in zip(clients, agents, strict=True)
                for call_id in calls[agent.token]
            ]
        )
    finally:
        for client in clients:
            await client.aclose()


def test_many_waits_share_one_connection_are_capped_per_agent_and_leave_the_server_answering(
    live_stack: LiveStack, live_db: None
) -> None:
    per_agent = settings.HARNESS_MAX_WAITS_PER_AGENT
    agents = [make_agent(mode="standard") for _ in range(3)]
    calls: dict[str, list[str]] = {}
    sessions = []
    for agent in agents:
        with live_stack.client(agent) as client:
            sessions.append(start(client))
            calls[agent.token] = [
                pending_call(client, sessions[-1], n) for n in range(per_agent + 1)
            ]
    extra = {a.token: calls[a.token].pop() for a in agents}  # one call each beyond the cap
    waits = len(agents) * per_agent
    deadline = time.monotonic() + 5  # other tests' channels stop lingering (1 s in tests)
    while [c for c in wake_clients() if int(c["sub"]) > 0] and time.monotonic() < deadline:
        time.sleep(0.05)
    before = {c["id"] for c in wake_clients()}  # other tests' hubs, idle (kept 30 s)

    outcome: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: outcome.update(
            responses=asyncio.run(hold_waits(live_stack, agents, calls, 6))
        )
    )
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(subscribed(s) for s in sessions):
            time.sleep(0.05)
        shared = [c for c in wake_clients() if int(c["sub"]) > 0]
        # Every waiting request of the process listens on one connection, on its session's
        # channel (one per session, whatever the number of waits in it).
        assert len(shared) == 1, shared
        assert int(shared[0]["sub"]) == len(agents)
        # (Each session's first wait subscribed; the rest were sent with it. A probe that
        # waits would take one of the slots it probes.)
        time.sleep(SETTLE)
        with live_stack.client(agents[0]) as client:
            began = time.monotonic()
            refused = client.get(f"/api/v1/calls/{extra[agents[0].token]}", params={"wait": 5})
            assert time.monotonic() - began < ANSWER_WITHIN
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "too_many_waits"
        assert f"already holds {per_agent} requests waiting" in refused.json()["error"]["message"]
        assert "wait=0" in refused.json()["error"]["message"]
        with live_stack.client(make_agent(mode="standard")) as client:
            began = time.monotonic()
            session = start(client)  # another agent is served at once
            assert time.monotonic() - began < ANSWER_WITHIN
            assert session["id"]
    finally:
        thread.join(30)
    assert [r.status_code for r in outcome["responses"]] == [200] * waits
    assert {r.json()["status"] for r in outcome["responses"]} == {"pending_approval"}
    # The slots are given back when the waits end, and nothing stays subscribed once the
    # channels' linger ends (HARNESS_WAKE_LINGER, 1 s in tests); the hub's connection stays
    # open while idle (wakeups.IDLE_CLOSE_AFTER), at most one more than before.
    with live_stack.client(agents[0]) as client:
        again = client.get(f"/api/v1/calls/{extra[agents[0].token]}", params={"wait": 0.2})
        assert again.status_code == 200, again.text
    deadline = time.monotonic() + 5
    while [c for c in wake_clients() if int(c["sub"]) > 0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [c for c in wake_clients() if int(c["sub"]) > 0] == []
    assert len({c["id"] for c in wake_clients()} - before) <= 1


def test_a_submission_beyond_the_cap_is_refused_before_anything_is_recorded(
    live_stack: LiveStack, live_db: None
) -> None:
    agent = make_agent(mode="standard")
    per_agent = settings.HARNESS_MAX_WAITS_PER_AGENT
    with live_stack.client(agent) as client:
        session = start(client)
        ids = [pending_call(client, session, n) for n in range(per_agent)]
    outcome: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: outcome.update(
            responses=asyncio.run(hold_waits(live_stack, [agent], {agent.token: ids}, 4))
        )
    )
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not subscribed(session):
            time.sleep(0.05)
        time.sleep(SETTLE)  # (the session's first wait subscribed; the rest came with it)
        with live_stack.client(agent) as client:
            body = {"calls": [{"id": "late", "name": "read_file", "arguments": {"path": "x"}}]}
            refused = client.post(
                f"/api/v1/sessions/{session['id']}/calls", params={"wait": 5}, json=body
            )
        assert refused.status_code == 429, refused.text
        assert not ToolCall.objects.filter(session_id=session["id"], tool_use_id="late").exists()
    finally:
        thread.join(30)
