"""rtruncap, what held: a call that ends without running (denied at the worker's re-check,
given back because its workspace was busy) gives its owner's place among running calls
back, with a message for a turn owed meanwhile, so no count is left over and no waiting
call of the owner is left without a message."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from dispatcher import agents, batches, execution
from dispatcher.models import Agent, Status, ToolCall
from dispatcher.tools import workspace_lock
from floor import celery_message
from floor.redis_clients import redis_at
from tests.support.factories import make_agent, submit_one

pytestmark = pytest.mark.django_db


@pytest.fixture
def lane(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[tuple[Any, str]]:
    """The run's broker, a queue no live worker takes from, a cap of one call per owner."""
    target = celery_message.raw_target(batches.EXECUTE_TASK)
    assert target is not None, "the test settings' broker is plain Redis"
    url, name = target[0], f"rtruncap-{uuid.uuid4()}"
    monkeypatch.setattr(celery_message, "raw_target", lambda task: (url, name))
    monkeypatch.setattr(execution, "_LOCK_PATIENCE", 0.1)
    settings.HARNESS_MAX_RUNNING_PER_OWNER = "1"
    broker = redis_at(url)
    yield broker, name
    leftover = list(broker.scan_iter(f"{name}*"))
    if leftover:
        broker.delete(*leftover)


def queued(fx: Any, session: Any, name: str, args: dict[str, Any]) -> ToolCall:
    call: ToolCall = submit_one(session, name, args)
    assert call.status == Status.QUEUED
    batches.enqueue(str(call.pk), batches.agent_of(call))
    return call


def places(broker: Any, queue: str, fx: Any) -> int:
    return int(broker.zcard(batches._running_key(queue, str(fx.owner.pk))))


def test_a_call_denied_at_the_workers_recheck_gives_its_place_back(
    lane: tuple[Any, str],
) -> None:
    broker, queue = lane
    fx = make_agent(mode="trusted")
    first = queued(fx, agents.start_session(agent=fx.agent), "list_directory", {"path": "."})
    second = queued(fx, agents.start_session(agent=fx.agent), "list_directory", {"path": "."})
    # The agent's token is voided while both wait (as the worker reads it after the void).
    Agent.objects.filter(pk=fx.agent.pk).update(token_voided_at=timezone.now())
    assert broker.rpop(queue) is not None
    execution.execute_turn("message")
    assert ToolCall.objects.get(pk=first.pk).status == Status.DENIED
    assert places(broker, queue, fx) == 0
    assert broker.rpop(queue) is not None
    execution.execute_turn("message")
    assert ToolCall.objects.get(pk=second.pk).status == Status.DENIED
    assert places(broker, queue, fx) == 0 and broker.llen(queue) == 0
    assert not broker.exists(batches._owed_key(queue))


def test_a_call_given_back_for_a_busy_workspace_gives_its_place_back(
    lane: tuple[Any, str],
) -> None:
    broker, queue = lane
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    call = queued(fx, session, "run_command", {"argv": ["true"]})
    assert broker.rpop(queue) is not None
    with workspace_lock.held(Path(session.workspace)):  # another command of it runs
        execution.execute_turn("message")
    # Given back to its turn with a message, and its place given back: it runs next.
    assert ToolCall.objects.get(pk=call.pk).status == Status.QUEUED
    assert places(broker, queue, fx) == 0 and broker.llen(queue) == 1
    assert broker.rpop(queue) is not None
    execution.execute_turn("message")
    assert ToolCall.objects.get(pk=call.pk).status == Status.COMPLETED
    assert places(broker, queue, fx) == 0 and broker.llen(queue) == 0
