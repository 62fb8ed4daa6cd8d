"""rtruncap: the running cap per owner (HARNESS_MAX_RUNNING_PER_OWNER, dispatcher.batches)
failed open when Redis failed. A worker holding a message whose take could not reach
Redis ran the message's own call with no place among its owner's running calls, and a
call whose place could not be moved to its lease (`hold`) was claimed and run anyway,
its place lapsing after the take's short grace: either way a call ran that the cap had
not counted, however many of its owner's calls already ran. Now, with a cap, a take
that fails runs nothing and a place that cannot be held is not claimed: the call stays
queued and the reconciler's re-send runs it, once, when Redis answers again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from dispatcher import agents, batches, execution
from dispatcher.models import Status, ToolCall
from floor import celery_message
from floor.redis_clients import redis_at
from tests.battery.procs import ProcessGroup, RedisServer
from tests.support.factories import make_agent, submit_one

pytestmark = pytest.mark.django_db


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    group = ProcessGroup(tmp_path)
    try:
        yield RedisServer(group)
    finally:
        group.stop_all()


@pytest.fixture
def lane(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> tuple[RedisServer, str]:
    """The execution lane on a Redis of the test's own (one it can kill), with a cap of
    one running call per owner."""
    name = f"rtruncap-{uuid.uuid4()}"
    monkeypatch.setattr(celery_message, "raw_target", lambda task: (redis_server.url, name))
    settings.HARNESS_MAX_RUNNING_PER_OWNER = "1"
    return redis_server, name


def two_calls() -> tuple[ToolCall, ToolCall]:
    """Two queued calls of one person (an agent's, each in a session of its own), each
    listed in its owner's turns with its message (as admission sends them)."""
    fx = make_agent(mode="trusted")
    calls = []
    for _ in range(2):
        session = agents.start_session(agent=fx.agent)
        call = submit_one(session, "list_directory", {"path": "."})
        assert call.status == Status.QUEUED
        batches.enqueue(str(call.pk), batches.agent_of(call))
        calls.append(call)
    return calls[0], calls[1]


def status(call: ToolCall) -> str:
    return str(ToolCall.objects.get(pk=call.pk).status)


def resend_stale(call: ToolCall, on_commit: Any) -> None:
    """The reconciler, once the call has waited its patience (HARNESS_REQUEUE_AFTER): its
    message sent after commit."""
    stale = timezone.now() - timedelta(seconds=settings.HARNESS_REQUEUE_AFTER + 1)
    ToolCall.objects.filter(pk=call.pk).update(queued_at=stale, enqueued_at=stale)
    with on_commit(execute=True):
        assert execution.reconcile()["resent"] == 1


def test_a_take_that_cannot_reach_redis_runs_no_call_past_the_cap(
    lane: tuple[RedisServer, str], django_capture_on_commit_callbacks: Any
) -> None:
    server, queue = lane
    first, second = two_calls()
    broker = redis_at(server.url)
    assert broker.rpop(queue) is not None
    running = batches.take_turn("message")  # the first call runs: its owner's one place
    assert running.call_id == str(first.pk) and running.slot
    assert broker.rpop(queue) is not None  # the second's message, held by a worker ...
    server.kill9()  # ... when Redis goes away: its owner's places cannot be counted
    execution.execute_turn(str(second.pk))
    # Before: the message's own call ran, though its owner's one place was taken.
    assert status(second) == Status.QUEUED
    # Not lost: when Redis is back (empty: no place, no list), the reconciler sends it
    # again and it runs, once.
    server.start()
    resend_stale(second, django_capture_on_commit_callbacks)
    assert broker.rpop(queue) is not None
    execution.execute_turn("message")
    assert status(second) == Status.COMPLETED
    assert ToolCall.objects.get(pk=second.pk).attempts == 1


def test_a_place_that_cannot_be_held_for_the_lease_is_not_claimed(
    lane: tuple[RedisServer, str], django_capture_on_commit_callbacks: Any
) -> None:
    server, queue = lane
    first, _ = two_calls()
    broker = redis_at(server.url)
    assert broker.rpop(queue) is not None
    turn = batches.take_turn("message")
    assert turn.call_id == str(first.pk) and turn.slot
    server.kill9()  # between the take and the claim: the place lapses after the grace
    execution.execute_call(turn.call_id, turn=turn)
    # Before: claimed and run, on a place that lapses long before the call's lease.
    assert status(first) == Status.QUEUED
    server.start()
    resend_stale(first, django_capture_on_commit_callbacks)
    assert broker.rpop(queue) is not None
    execution.execute_turn("message")
    assert status(first) == Status.COMPLETED
