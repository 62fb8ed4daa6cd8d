"""rtown: the execution queue's turns were per agent, so a person holding fifty agents
(each made in the dashboard, by `create_agent`, or by an OAuth client's sign-in) had fifty
turns for every one of another person's, and another person's call waited for one call of
each of them. Turns are now per owner, then per agent (dispatcher.batches): a ring of
owners, each with a ring of its agents, each with its list of calls."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connections

from audit.models import AuditEvent
from dispatcher import batches
from dispatcher.models import Status, ToolCall
from floor import celery_message
from floor.redis_clients import redis_at
from tests.battery.live import native, start_session, started_counts, wait_terminal
from tests.battery.procs import ProcessGroup, RedisServer, Stack, wait_until
from tests.battery.tools import EXTRA_TOOLS
from tests.support.factories import make_agent, make_user, unique


@pytest.fixture
def queue(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    """The run's broker and a queue of the test's own (no live worker takes from it)."""
    target = celery_message.raw_target(batches.EXECUTE_TASK)
    assert target is not None, "the test settings' broker is plain Redis"
    url, name = target[0], f"rtown-{uuid.uuid4()}"
    monkeypatch.setattr(celery_message, "raw_target", lambda task: (url, name))
    broker = redis_at(url)
    yield broker, name
    leftover = list(broker.scan_iter(f"{name}*"))
    if leftover:
        broker.delete(*leftover)


def take_all(broker: Any, queue: str) -> list[str]:
    """Every turn, one per message, as workers take them."""
    turns = []
    while broker.rpop(queue) is not None:
        turns.append(batches.next_turn("message"))
    return turns


def test_many_agents_of_one_owner_share_one_turn(queue: tuple[Any, str]) -> None:
    broker, name = queue
    many, one = "1", "2"  # two people's ids
    agents = [str(uuid.uuid4()) for _ in range(50)]
    calls = {agent: [f"{agent}/{i}" for i in range(4)] for agent in agents}
    for i in range(4):
        for agent in agents:
            batches.enqueue(calls[agent][i], batches.Share(many, agent))
    lone = str(uuid.uuid4())
    own = [f"{lone}/{i}" for i in range(4)]
    for call in own:
        batches.enqueue(call, batches.Share(one, lone))
    ownerless = str(uuid.uuid4())  # a bare agent id: an owner of its own
    batches.enqueue(f"{ownerless}/0", ownerless)

    turns = take_all(broker, name)
    assert len(turns) == 50 * 4 + 4 + 1 and "message" not in turns
    # The other person's calls and the agent of no known owner come at once, not after
    # one call of each of the fifty agents.
    assert turns[:3] == [calls[agents[0]][0], own[0], f"{ownerless}/0"], turns[:3]
    assert [turns.index(c) for c in own] == [1, 4, 6, 8]  # owners: many, one, ownerless
    # The fifty agents take turns within their owner's, and each keeps its order.
    by_agent: dict[str, list[str]] = defaultdict(list)
    for turn in turns:
        by_agent[turn.split("/")[0]].append(turn)
    assert all(by_agent[agent] == calls[agent] for agent in agents)
    mine = [t.split("/")[0] for t in turns if t.split("/")[0] in calls]
    assert mine[:50] == agents and mine[50:100] == agents
    assert not list(broker.scan_iter(f"{name}:fair:*"))  # nothing left listed


def test_resends_keep_messages_and_listed_calls_even(queue: tuple[Any, str]) -> None:
    """Lost messages re-sent add messages only; places lost (the owners' ring, an owner's
    ring of agents, an agent's list) come back with the re-send of a call of theirs."""
    broker, name = queue
    ring, prefix = batches._fair_keys(name)
    owner, other = "7", "8"
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    elsewhere = str(uuid.uuid4())
    batches.enqueue("a1", batches.Share(owner, first))
    batches.enqueue("a2", batches.Share(owner, first))
    batches.enqueue("b1", batches.Share(owner, second))
    batches.enqueue("c1", batches.Share(other, elsewhere))
    broker.delete(name)  # every message lost
    for call, agent, who in (("a1", first, owner), ("a2", first, owner), ("b1", second, owner)):
        batches.enqueue(call, batches.Share(who, agent), resend=True)
    batches.enqueue("c1", batches.Share(other, elsewhere), resend=True)
    assert broker.llen(name) == 4  # one message a call, no second place
    assert broker.lrange(prefix + first, 0, -1) == [b"a1", b"a2"]
    # The owners' ring and one owner's ring of agents lost (evicted): each re-send of a
    # call of theirs puts them back, and the calls are taken again.
    broker.delete(ring, batches._owner_key(name, owner))
    batches.enqueue("b1", batches.Share(owner, second), resend=True)
    batches.enqueue("a1", batches.Share(owner, first), resend=True)
    batches.enqueue("c1", batches.Share(other, elsewhere), resend=True)
    # An agent's list lost with its set kept: the re-sent call is listed again.
    broker.delete(prefix + elsewhere)
    batches.enqueue("c1", batches.Share(other, elsewhere), resend=True)
    turns = take_all(broker, name)
    # Each call once; the messages beyond the listed calls run their own call (claimed once).
    assert sorted(t for t in turns if t != "message") == ["a1", "a2", "b1", "c1"], turns
    assert turns[:4] == ["b1", "c1", "a1", "a2"], turns
    assert not list(broker.scan_iter(f"{name}:fair:*"))


# --- With a real daphne, Celery worker and reconciler ------------------------------------

AGENTS = 40  # of one person
CALLS = 3  # each, one a session
SLOW = 1.0  # seconds each call of theirs runs
WORKERS = 4


@pytest.fixture
def stack(tmp_path: Path, django_db_setup: None, django_db_blocker: Any) -> Iterator[Stack]:
    group = ProcessGroup(tmp_path)
    try:
        with django_db_blocker.unblock():
            # No rate per person (0): the flood is one person's 240 requests at once, past
            # their bucket; what is measured here is the queue's turns, not the web's caps.
            yield Stack(
                group,
                RedisServer(group),
                HARNESS_EXTRA_TOOLS=EXTRA_TOOLS,
                HARNESS_PERSON_REQUESTS_PER_SECOND="0",
            )
            connections.close_all()
    finally:
        group.stop_all()


def send(client: Any, session: str, tool_use_id: str, delay: float) -> str:
    body = native(tool_use_id, "battery_marker", {"path": f"m/{tool_use_id}.txt", "delay": delay})
    response = client.post(f"/api/v1/sessions/{session}/calls", json=body)
    assert response.status_code in (200, 202), response.text[:300]
    return str(response.json()["calls"][0]["id"])


def timed(client: Any, tool_use_id: str) -> float:
    session = start_session(client)
    began = time.monotonic()
    body = native(tool_use_id, "battery_marker", {"path": "m.txt"})
    response = client.post(f"/api/v1/sessions/{session['id']}/calls?wait=60", json=body)
    took = time.monotonic() - began
    assert response.status_code == 200, response.text[:300]
    assert response.json()["calls"][0]["status"] == "completed", response.text[:500]
    return took


@pytest.mark.live
@pytest.mark.timeout(400)
def test_one_persons_many_agents_do_not_hold_back_another_persons_call(stack: Stack) -> None:
    url = stack.daphne()
    stack.worker(WORKERS)
    stack.beat()  # the reconciler: every second, re-sending calls queued 3 s
    person: User = make_user(unique("many"), mode="trusted")
    fleet = [make_agent(mode="trusted", owner=person) for _ in range(AGENTS)]
    other = make_agent(mode="trusted")
    clients = [stack.agent_client(url, fx.headers, timeout=60) for fx in fleet]
    with stack.agent_client(url, other.headers, timeout=70) as quiet:
        idle = max(timed(quiet, f"idle{i}") for i in range(3))
        # Sessions first (one a call: nothing waits for a workspace), so that the calls
        # are sent faster than the workers run them.
        sessions = [[start_session(c)["id"] for _ in range(CALLS)] for c in clients]
        sent: dict[int, list[str]] = defaultdict(list)
        for k in range(CALLS):  # round by round: every agent has calls queued at once
            for n, client in enumerate(clients):
                sent[n].append(send(client, sessions[n][k], f"a{n}-{k}", SLOW))
        flooded = timed(quiet, "flooded")
    for client in clients:
        client.close()
    ids = [call for calls in sent.values() for call in calls]
    # The reconciler re-sent what waited, and the messages then lost with their places:
    # every call still runs, once.
    queue = stack.env["HARNESS_CELERY_QUEUE"]
    broker = redis_at(stack.redis.url)
    broker.delete(queue, batches._fair_keys(queue)[0])
    left = wait_terminal(ids, 240)
    print(f"idle {idle:.3f}s flooded {flooded:.3f}s ({AGENTS} agents of one person)")
    assert not left, f"{len(left)} calls unfinished"
    statuses = set(ToolCall.objects.filter(pk__in=ids).values_list("status", flat=True))
    assert statuses == {Status.COMPLETED}, statuses
    assert set(started_counts(ids).values()) == {1}
    # Per agent, its calls started in the order it sent them.
    order = list(
        AuditEvent.objects.filter(kind="call.started", subject__in=[f"call:{i}" for i in ids])
        .order_by("pk")
        .values_list("subject", flat=True)
    )
    for calls in sent.values():
        assert [s for s in order if s.removeprefix("call:") in calls] == [
            f"call:{c}" for c in calls
        ]
    # Nothing left listed, no message left over.
    wait_until(lambda: broker.llen(queue) == 0, 30, "the queue to drain")
    assert not list(broker.scan_iter(f"{queue}:fair:*"))
    # One call of each agent would be AGENTS calls of SLOW seconds on WORKERS processes
    # (10 s); one call of the person is at most the running calls and one more.
    assert flooded < idle + 4 * SLOW + 1.0, (idle, flooded)
