"""rtcap4: a Redis that lost its data (restarted empty, flushed) has its running places
counted again from the database (batches.count_running). A call whose place was held
(`hold`) before the loss and whose claim had not committed when the count read was not
counted: its owner's next call started beside it, two of one person's calls at once
under a cap of one (the hold-to-claim moment: median 15 ms, p99 35 ms). Now the claim
commits only if Redis still has the mark's generation its hold read
(batches.kept_since_hold, asked in the claim's transaction), else it is rolled back and
the call sent again; and the count reads only once every claim in flight has committed
(a claim that asked before the loss is then counted)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection

from dispatcher import agents, batches, execution, transitions
from dispatcher.models import Status, ToolCall
from floor.redis_clients import redis_at
from floor.sqlite3 import base as sqlite_backend
from tests.battery.procs import RedisServer, wait_until
from tests.support.factories import make_agent, submit_one
from tests.support.running_cap import live_places, status, worker

POSTGRES = "postgresql" in django_settings.DATABASES["default"]["ENGINE"]


class Seam:
    """A point a worker's thread stops at until the test lets it go on."""

    def __init__(self) -> None:
        self.reached, self.go = threading.Event(), threading.Event()

    def stop(self) -> None:
        self.reached.set()
        assert self.go.wait(60), "the test never let the worker go on"


def count_waits_for_the_claim(monkeypatch: pytest.MonkeyPatch) -> Callable[[], bool]:
    """Whether the count (batches.count_running) is waiting for a transaction in flight:
    on PostgreSQL its lock, on SQLite its BEGIN IMMEDIATE seeing the write lock held."""
    if POSTGRES:

        def waiting() -> bool:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE 'LOCK TABLE %%' AND pid <> pg_backend_pid()"
                )
                return bool(cursor.fetchone()[0])

        return waiting
    seen = threading.Event()
    real = sqlite_backend._locked

    def locked(error: Any) -> bool:
        held = real(error)
        if held and threading.current_thread() is not threading.main_thread():
            seen.set()
        return held

    monkeypatch.setattr(sqlite_backend, "_locked", locked)
    return seen.is_set


def drain(broker: Any, queue: str) -> None:
    """Every message left taken by a worker, as a worker process would."""
    while broker.rpop(queue) is not None:
        execution.execute_turn(batches.OWED_TURN)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_redis_lost_between_a_hold_and_its_claim_starts_no_second_call_of_the_owner(
    own_cap_lane: tuple[RedisServer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, queue = own_cap_lane
    broker = redis_at(server.url)
    fx = make_agent(mode="trusted")
    first_session = agents.start_session(agent=fx.agent)
    first = submit_one(first_session, "runcap_wait_for", {"path": "go"})
    assert broker.rpop(queue) is not None  # (its message, sent after commit)
    # Worker A takes the first call and holds its owner's one place, and stops before its
    # claim ...
    seam = Seam()
    real_claim = transitions.claim

    def claim(call: ToolCall, *args: Any, **kwargs: Any) -> bool:
        if call.pk == first.pk:
            seam.stop()
        return real_claim(call, *args, **kwargs)

    monkeypatch.setattr(transitions, "claim", claim)
    threads = [worker(lambda: execution.execute_turn(str(first.pk)))]
    second_session = agents.start_session(agent=fx.agent)
    try:
        assert seam.reached.wait(30)
        assert live_places(broker, queue, fx.owner.pk) == 1
        broker.flushall()  # ... when Redis loses its data.
        # The owner's next call: its take counts the running calls again (none yet) and
        # takes the owner's place; it runs.
        second = submit_one(second_session, "runcap_wait_for", {"path": "go"})
        assert broker.rpop(queue) is not None
        threads.append(worker(lambda: execution.execute_turn(str(second.pk))))
        wait_until(lambda: status(second) == Status.RUNNING, 30, "the second call to run")
        seam.go.set()
        a = threads[0]
        wait_until(lambda: not a.is_alive() or status(first) == Status.RUNNING, 30, "A's claim")
        # Before: A's claim committed and the first call ran beside the second.
        assert status(first) == Status.QUEUED
        assert status(second) == Status.RUNNING
        assert live_places(broker, queue, fx.owner.pk) == 1
    finally:
        seam.go.set()
        Path(first_session.workspace, "go").touch()
        Path(second_session.workspace, "go").touch()
        for thread in threads:
            thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    # Not lost: A sent the first call again, and it runs once the second has ended.
    monkeypatch.setattr(transitions, "claim", real_claim)
    drain(broker, queue)
    for call in (first, second):
        row = ToolCall.objects.get(pk=call.pk)
        assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    assert live_places(broker, queue, fx.owner.pk) == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_claim_committing_while_the_places_are_counted_is_counted(
    own_cap_lane: tuple[RedisServer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis loses its data after the claim asked whether it still had the place, and
    before the claim committed: the count that follows waits for the commit."""
    server, queue = own_cap_lane
    broker = redis_at(server.url)
    fx = make_agent(mode="trusted")
    first_session = agents.start_session(agent=fx.agent)
    first = submit_one(first_session, "runcap_wait_for", {"path": "go"})
    second = submit_one(agents.start_session(agent=fx.agent), "list_directory", {"path": "."})
    assert broker.rpop(queue) is not None and broker.rpop(queue) is not None
    # Worker A's claim asks, in its transaction, and stops before its commit ...
    seam = Seam()
    real_kept = batches.kept_since_hold

    def kept_since_hold(turn: batches.Turn) -> bool:
        kept = real_kept(turn)
        if turn.call_id == str(first.pk):
            seam.stop()
        return kept

    monkeypatch.setattr(batches, "kept_since_hold", kept_since_hold)
    waiting = count_waits_for_the_claim(monkeypatch)
    threads = [worker(lambda: execution.execute_turn(str(first.pk)))]
    try:
        assert seam.reached.wait(30)
        broker.flushall()  # ... when Redis loses its data.
        # A message for the owner's next call (the reconciler's re-send of it): its take
        # counts the running calls again, once A's claim has committed.
        threads.append(worker(lambda: execution.execute_turn(str(second.pk))))
        b = threads[1]
        wait_until(lambda: waiting() or not b.is_alive(), 30, "the count to wait for the claim")
        seam.go.set()
        a = threads[0]
        wait_until(
            lambda: status(first) != Status.QUEUED or not a.is_alive(), 30, "A's claim to commit"
        )
        wait_until(lambda: not b.is_alive(), 30, "the next call's turn")
        # Before: the count read before the commit, and the second call ran beside the
        # first.
        assert status(first) == Status.RUNNING
        assert status(second) == Status.QUEUED
        assert live_places(broker, queue, fx.owner.pk) == 1
    finally:
        seam.go.set()
        Path(first_session.workspace, "go").touch()
        for thread in threads:
            thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    monkeypatch.setattr(batches, "kept_since_hold", real_kept)
    drain(broker, queue)
    for call in (first, second):
        row = ToolCall.objects.get(pk=call.pk)
        assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    assert live_places(broker, queue, fx.owner.pk) == 0
