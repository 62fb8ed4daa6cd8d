"""rtq: the execution lane's turns (dispatcher.batches) against one agent whose queued
calls wait for each other's workspace lock. A worker that took a call of a session whose
workspace another call holds (a command runs: the lock is exclusive) waited for the
lock, holding its process: one agent's few slow commands in one session held every
worker, and another agent's single listing waited behind all of them, whatever its turn.
A real daphne and a real Celery worker (4 processes)."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from dispatcher import batches
from floor import celery_message
from floor.redis_clients import redis_at
from tests.battery.procs import wait_until
from tests.support.factories import make_agent
from tests.support.live import LiveStack

# seconds the slow agent's first command runs (10, not 6: the quiet call's bound is half
# of it, and a loaded host's live round trip of a listing may take more than 3 s)
SLOW = 10
# seconds each of its commands queued behind the first runs: a worker that waits for the
# lock is held for the first one's SLOW seconds whatever its own command takes (each
# waited out SLOW too before: 50 s of every CI run)
QUEUED = 1
WORKERS = 4  # the live stack's worker processes


def running(client: httpx.Client, call_id: str) -> bool:
    answer = client.get(f"/api/v1/calls/{call_id}")
    assert answer.status_code == 200, answer.text[:300]
    return bool(answer.json()["status"] == "running")


def start(client: httpx.Client) -> str:
    response = client.post("/api/v1/sessions", json={"title": "locked"})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@pytest.mark.live
def test_calls_waiting_for_their_workspace_do_not_hold_the_workers(
    live_stack: LiveStack, live_db: None
) -> None:
    slow, other = make_agent(mode="trusted"), make_agent(mode="standard")
    with live_stack.client(slow) as a, live_stack.client(other, timeout=60) as b:
        session, quiet = start(a), start(b)
        ids: list[str] = []
        for i in range(WORKERS + 1):  # one running, the others waiting for its lock
            response = a.post(
                f"/api/v1/sessions/{session}/calls",
                json={
                    "calls": [
                        {
                            "id": f"s{i}",
                            "name": "run_command",
                            "arguments": {"argv": ["sleep", str(QUEUED if i else SLOW)]},
                        }
                    ]
                },
            )
            assert response.status_code in (200, 202), response.text[:300]
            assert response.json()["calls"][0]["status"] == "queued", response.text[:300]
            ids.append(response.json()["calls"][0]["id"])
            if not i:  # the long one holds the lock before the others are sent
                wait_until(lambda: running(a, ids[0]), 30, "the first command to run")
        time.sleep(1)  # the worker processes have taken the commands
        began = time.monotonic()
        response = b.post(
            f"/api/v1/sessions/{quiet}/calls",
            params={"wait": 50},
            json={"calls": [{"id": "l", "name": "list_directory", "arguments": {"path": "."}}]},
        )
        took = time.monotonic() - began
        assert response.status_code == 200, response.text
        assert response.json()["calls"][0]["status"] == "completed", response.text[:500]
        # Every command still runs, one at a time.
        for call_id in ids:
            answer = a.get(f"/api/v1/calls/{call_id}", params={"wait": 50}, timeout=60)
            assert answer.json()["status"] == "completed", answer.text[:300]
    assert took < SLOW / 2, took


def test_an_agent_whose_place_in_the_ring_was_lost_is_served_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ring's key lost alone (deleted, evicted) while its agents' lists were kept: an
    agent joins the ring only when its list was empty, so its queued calls were never
    taken again (each ran only when a message found the ring empty) and its list grew
    with every call it sent. The reconciler's re-send of one of its calls puts it back."""
    target = celery_message.raw_target(batches.EXECUTE_TASK)
    assert target is not None, "the test settings' broker is plain Redis"
    url, queue = target[0], f"rtq-{uuid.uuid4()}"  # a queue no live worker takes from
    monkeypatch.setattr(celery_message, "raw_target", lambda task: (url, queue))
    broker = redis_at(url)
    ring, prefix = batches._fair_keys(queue)
    stranded, other = str(uuid.uuid4()), str(uuid.uuid4())
    first, second, others = (str(uuid.uuid4()) for _ in range(3))
    keys = [queue, ring, *(prefix + a + s for a in (stranded, other) for s in ("", ":in"))]
    try:
        batches.enqueue(first, stranded)
        batches.enqueue(second, stranded)
        broker.delete(ring)  # lost; the agent's list kept
        batches.enqueue(others, other)
        batches.enqueue(first, stranded, resend=True)  # the reconciler: `first` waited
        turns = [batches.next_turn("message") for _ in range(4)]
        assert turns == [others, first, second, "message"], turns
        assert not broker.exists(prefix + stranded)
    finally:
        broker.delete(*keys)
