"""rt2cap3: the running places counted again from the database after Redis lost its data
(batches.count_running) are written a moment after they are read. A call that ended in
between (its worker gave its place back, `call:<id>`, before the count wrote it) left
that place behind for the rest of its lease, a tool's timeout and the grace: its owner,
with nothing running, started no call until then (under a cap of one). A second count
racing the first (two workers finding the mark gone at once) wrote the same stale place.
Now the count reads again which of the calls it wrote still run, and takes back the
places of those that ended."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connection, connections, transaction

from audit.models import AuditEvent
from dispatcher import agents, batches, transitions
from dispatcher.models import Status, ToolCall
from dispatcher.tools.registry import get_tool
from floor import celery_message
from floor.redis_clients import redis_at
from tests.battery.procs import ProcessGroup, RedisServer, wait_until
from tests.support.factories import make_agent, submit_one
from tests.support.running_cap import mark_counted


@pytest.fixture
def lane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> Iterator[tuple[RedisServer, str]]:
    """The execution lane on a Redis of the test's own (one it can flush), a cap of one
    running call per owner."""
    group = ProcessGroup(tmp_path)
    try:
        server = RedisServer(group)
        name = f"rt2cap3-{uuid.uuid4()}"
        monkeypatch.setattr(celery_message, "raw_target", lambda task: (server.url, name))
        settings.HARNESS_MAX_RUNNING_PER_OWNER = "1"
        settings.HARNESS_TOOLS = [
            *settings.HARNESS_TOOLS,
            "tests.dispatcher.test_runcap_tools.WAIT_FOR",
        ]
        yield server, name
    finally:
        group.stop_all()


def live_places(broker: Any, queue: str, owner: int) -> list[bytes]:
    seconds, micro = broker.time()
    key = batches._running_key(queue, str(owner))
    return list(broker.zrangebyscore(key, seconds + micro / 1e6, "+inf"))


def waiting_on_a_lock(table: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE %s AND pid <> pg_backend_pid()",
            [f"%{table}%"],
        )
        return bool(cursor.fetchone()[0])


@pytest.mark.skipif(
    "postgresql" not in django_settings.DATABASES["default"]["ENGINE"],
    reason="holds the count between its reads with a PostgreSQL table lock",
)
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_call_ending_while_the_places_are_counted_leaves_no_place_behind(
    lane: tuple[RedisServer, str],
) -> None:
    server, queue = lane
    broker = redis_at(server.url)
    mark_counted(broker, queue)
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    long = submit_one(session, "runcap_wait_for", {"path": "go"})
    assert broker.rpop(queue) is not None  # (its message, sent after commit)
    # A worker's turn, as execution.execute_turn takes it: the place, its hold, the claim.
    turn = batches.take_turn(str(long.pk))
    assert turn.call_id == str(long.pk)
    row = ToolCall.objects.select_related("session__agent").get(pk=long.pk)
    tool = get_tool(row.name)
    assert tool is not None
    assert batches.hold(turn, tool.timeout + 1, batches.agent_of(row))
    assert transitions.claim(row, tool)
    turn.claimed = True
    broker.flushall()  # Redis lost its data while the call ran

    later = submit_one(agents.start_session(agent=fx.agent), "list_directory", {"path": "."})
    taken: list[batches.Turn] = []
    locked, unlock = threading.Event(), threading.Event()
    table = AuditEvent._meta.db_table

    def hold_the_audit_table() -> None:
        # The count's second read waits here, after its first saw the call running.
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
                locked.set()
                unlock.wait(60)
        finally:
            connections.close_all()

    def next_worker() -> None:
        try:
            taken.append(batches.take_turn(str(later.pk)))
        finally:
            connections.close_all()

    locker = threading.Thread(target=hold_the_audit_table, daemon=True)
    locker.start()
    assert locked.wait(30)
    counter = threading.Thread(target=next_worker, daemon=True)
    counter.start()
    wait_until(lambda: waiting_on_a_lock(table), 30, "the count to wait for its second read")
    # The call ends meanwhile: its worker's turn gives its places back (none yet in Redis).
    ToolCall.objects.filter(pk=long.pk).update(status=Status.COMPLETED, lease_until=None)
    batches.end_turn(turn)
    unlock.set()
    counter.join(30)
    locker.join(30)
    assert not counter.is_alive()
    # Before: the ended call's place stayed until its lease's end (the tool's timeout and
    # the grace), and the owner's next call was not taken (nothing of theirs running).
    assert f"call:{long.pk}".encode() not in live_places(broker, queue, fx.owner.pk)
    [turn_later] = taken
    assert turn_later.call_id == str(later.pk)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_the_mark_deleted_alone_counts_no_running_call_twice(
    lane: tuple[RedisServer, str], settings: Any
) -> None:
    """The running sets kept, their mark deleted or evicted alone: the count added each
    running call's place beside its turn's, and an owner with one call running under a cap
    of two started no other until it ended."""
    settings.HARNESS_MAX_RUNNING_PER_OWNER = "2"
    server, queue = lane
    broker = redis_at(server.url)
    mark_counted(broker, queue)
    fx = make_agent(mode="trusted")
    long = submit_one(agents.start_session(agent=fx.agent), "runcap_wait_for", {"path": "go"})
    assert broker.rpop(queue) is not None
    turn = batches.take_turn(str(long.pk))
    row = ToolCall.objects.select_related("session__agent").get(pk=long.pk)
    tool = get_tool(row.name)
    assert tool is not None
    assert batches.hold(turn, tool.timeout + 1, batches.agent_of(row))
    assert transitions.claim(row, tool)
    turn.claimed = True
    broker.delete(batches._counted_key(queue))
    later = submit_one(agents.start_session(agent=fx.agent), "list_directory", {"path": "."})
    assert broker.rpop(queue) is not None
    # Before: the running call held two places, and the owner's second call waited.
    assert batches.take_turn(str(later.pk)).call_id == str(later.pk)
    assert broker.get(batches._counted_key(queue)) is not None  # (its generation: a new one)
    places = live_places(broker, queue, fx.owner.pk)
    assert turn.slot.encode() in places and f"call:{long.pk}".encode() not in places
