"""rtcap3: a call is counted in the share of the owner whose ring its take found it in. An
agent moved to another person (agents.transfer_agent) with a call still listed in its
former owner's ring had that call counted as the former owner's: it started beside a
call of its new owner running at their cap of one, two of one person's calls at once.
Now its hold gives the former owner's place back and takes one among its owner's
running calls, below the cap or not at all (then the call is sent again)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from dispatcher import agents, batches, execution
from dispatcher.models import Agent, Status, ToolCall
from floor import celery_message
from floor.redis_clients import redis_at
from tests.battery.procs import wait_until
from tests.support.factories import make_agent, submit_one


@pytest.fixture
def lane(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[tuple[Any, str]]:
    """The run's broker, a queue no live worker takes from, a cap of one call per owner,
    and a tool whose call runs until the test lets it end."""
    target = celery_message.raw_target(batches.EXECUTE_TASK)
    assert target is not None, "the test settings' broker is plain Redis"
    url, name = target[0], f"rtcap3-{uuid.uuid4()}"
    monkeypatch.setattr(celery_message, "raw_target", lambda task: (url, name))
    settings.HARNESS_MAX_RUNNING_PER_OWNER = "1"
    settings.HARNESS_TOOLS = [
        *settings.HARNESS_TOOLS,
        "tests.dispatcher.test_runcap_tools.WAIT_FOR",
    ]
    broker = redis_at(url)
    broker.set(batches._counted_key(name), 1)  # (a queue of its own: nothing runs yet)
    yield broker, name
    leftover = list(broker.scan_iter(f"{name}*"))
    if leftover:
        broker.delete(*leftover)


def status(call: ToolCall) -> str:
    return str(ToolCall.objects.get(pk=call.pk).status)


def live_places(broker: Any, queue: str, owner: int) -> int:
    seconds, micro = broker.time()
    key = batches._running_key(queue, str(owner))
    return int(broker.zcount(key, seconds + micro / 1e6, "+inf"))


def worker(target: Callable[[], None]) -> threading.Thread:
    """A worker process's thread (its own database connection, closed when it ends)."""

    def run() -> None:
        try:
            target()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_call_of_an_agent_moved_to_another_person_counts_in_that_persons_share(
    lane: tuple[Any, str],
) -> None:
    broker, queue = lane
    moved, theirs = make_agent(mode="trusted"), make_agent(mode="trusted")
    # A call of the new owner's own runs, at their cap of one ...
    session = agents.start_session(agent=theirs.agent)
    long = submit_one(session, "runcap_wait_for", {"path": "go"})
    assert broker.rpop(queue) is not None
    thread = worker(lambda: execution.execute_turn(str(long.pk)))
    try:
        wait_until(lambda: status(long) == Status.RUNNING, 30, "their call to run")
        # ... when the moving agent's call is listed in its first owner's ring.
        later = submit_one(agents.start_session(agent=moved.agent), "list_directory", {"path": "."})
        assert later.status == Status.QUEUED
        Agent.objects.filter(pk=moved.agent.pk).update(owner=theirs.owner)
        assert broker.rpop(queue) is not None
        execution.execute_turn(str(later.pk))
        # Before: counted in its former owner's share, it ran beside its new owner's call.
        assert status(later) == Status.QUEUED
        assert status(long) == Status.RUNNING
        assert live_places(broker, queue, moved.owner.pk) == 0
        assert live_places(broker, queue, theirs.owner.pk) == 1
    finally:
        Path(session.workspace, "go").touch()
        thread.join(30)
    assert not thread.is_alive()
    while broker.rpop(queue) is not None:
        execution.execute_turn(str(later.pk))
    for call in (long, later):
        row = ToolCall.objects.get(pk=call.pk)
        assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    assert live_places(broker, queue, theirs.owner.pk) == 0
