"""rtfair: one agent's flood of auto-allowed calls against another agent's single call,
through a real daphne and a real Celery worker (the execution lane)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import pytest

from dispatcher import agents, batches
from dispatcher.models import TERMINAL_STATUSES, ToolCall
from floor import celery_message
from floor.redis_clients import redis_at
from tests.support.factories import make_agent
from tests.support.live import LiveStack

BATCH = 64  # HARNESS_MAX_CALLS_PER_BATCH
MESSAGES = 20  # well inside the request burst (60)


def start(client: httpx.Client) -> str:
    response = client.post("/api/v1/sessions", json={"title": "fair"})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def listing(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "name": "list_directory", "arguments": {"path": "."}}


def one_call(client: httpx.Client, session: str, call_id: str) -> float:
    began = time.monotonic()
    response = client.post(
        f"/api/v1/sessions/{session}/calls", params={"wait": 30}, json={"calls": [listing(call_id)]}
    )
    took = time.monotonic() - began
    assert response.status_code == 200, response.text
    assert response.json()["calls"][0]["status"] == "completed", response.text[:500]
    return took


@pytest.mark.live
def test_one_agents_queued_flood_does_not_hold_back_another_agents_call(
    live_stack: LiveStack, live_db: None
) -> None:
    flooder, other = make_agent(mode="standard"), make_agent(mode="standard")
    with live_stack.client(flooder) as a, live_stack.client(other, timeout=60) as b:
        quiet = start(b)
        idle = max(one_call(b, quiet, f"idle{i}") for i in range(3))
        session = start(a)
        for m in range(MESSAGES):
            calls = [listing(f"f{m}-{i}") for i in range(BATCH)]
            response = a.post(f"/api/v1/sessions/{session}/calls", json={"calls": calls})
            assert response.status_code in (200, 202), response.text[:300]
        flooded = one_call(b, quiet, "flooded")
    print(f"idle {idle:.3f}s flooded {flooded:.3f}s")
    try:
        assert flooded < 2 * idle + 1.0, (idle, flooded)
    finally:
        drain(flooder.agent)


def drain(agent: Any) -> None:
    """The flood's calls left queued would be the next live test's (its reconciler re-sent
    hundreds of them, its batches waited behind them): the flooder is revoked, so the
    worker's re-check denies what is left at once, and the test ends when none is left."""
    agents.revoke_agent(agent=agent, actor="test")
    unfinished = ToolCall.objects.filter(session__agent=agent).exclude(status__in=TERMINAL_STATUSES)
    deadline = time.monotonic() + 300
    while unfinished.exists():
        assert time.monotonic() < deadline, f"{unfinished.count()} flood calls still unfinished"
        time.sleep(0.5)


def test_a_lost_message_resent_leaves_as_many_messages_as_queued_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A message lost (the queue deleted, a worker killed holding it) leaves its call in its
    agent's list. The reconciler's re-send adds a message only: with a second place too, one
    call more than messages stayed in the lists for good, and the last call of every later
    burst waited for the reconciler (a batch of 10 listings came back with one queued)."""
    target = celery_message.raw_target(batches.EXECUTE_TASK)
    assert target is not None, "the test settings' broker is plain Redis"
    # A queue of its own: a live stack's worker, started by an earlier test, takes from
    # the run's queue.
    url, queue = target[0], f"rtfair-{uuid.uuid4()}"
    monkeypatch.setattr(celery_message, "raw_target", lambda task: (url, queue))
    broker = redis_at(url)
    ring, prefix = batches._fair_keys(queue)
    agent, call = str(uuid.uuid4()), str(uuid.uuid4())
    broker.delete(queue, ring, prefix + agent, prefix + agent + ":in")
    try:
        batches.enqueue(call, agent)
        broker.delete(queue)  # the message is lost
        batches.enqueue(call, agent, resend=True)
        assert broker.llen(queue) == 1
        assert broker.lrange(prefix + agent, 0, -1) == [call.encode()]
        # Whichever message a worker takes runs the ring's next call: this one, once.
        assert batches.next_turn("another") == call
        assert not broker.exists(ring, prefix + agent, prefix + agent + ":in")
        # A message with nothing left in the ring runs its own call (claimed once).
        assert batches.next_turn("another") == "another"
    finally:
        broker.delete(queue, ring, prefix + agent, prefix + agent + ":in")
