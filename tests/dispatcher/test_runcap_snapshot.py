"""sock: the running cap's places live in Redis, beside a mark that says they count every
running call (batches._counted_key). A Redis that came back from an older snapshot (a
restart that loaded its dump, a backup restored, a lagging replica promoted) brought the
mark back with the sets of that moment: no recount, and the calls started since had no
place, so the owner's next call started beside a running one, past the cap. The mark now
names the Redis process that set it (its run_id, new at every start): one brought back by
a snapshot is no mark, and the places are counted again from the database first."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher import agents, batches, execution
from dispatcher.models import Status, ToolCall
from floor.redis_clients import redis_at
from tests.battery.procs import RedisServer, wait_until
from tests.support.factories import make_agent, submit_one
from tests.support.running_cap import live_places, status, worker


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("seat", [False, True])
def test_redis_back_from_an_older_snapshot_starts_no_other_call_of_its_owner(
    own_cap_lane: tuple[RedisServer, str], seat: bool
) -> None:
    """`seat`: the owner's next call comes by a message that finds the ring empty (its
    place is taken at its hold), not by its take."""
    server, queue = own_cap_lane
    broker = redis_at(server.url)
    mark = batches._counted_key(queue)
    fx = make_agent(mode="trusted")
    batches.count_running(server.url, queue)  # (what the first take does: the mark set)
    broker.save()  # the snapshot: the mark, and no place of the owner's
    snapshot_mark = broker.get(mark)
    assert snapshot_mark is not None
    first_session = agents.start_session(agent=fx.agent)
    long = submit_one(first_session, "runcap_wait_for", {"path": "go"})
    assert broker.rpop(queue) is not None  # (its message, sent after commit)
    thread = worker(lambda: execution.execute_turn(str(long.pk)))
    try:
        wait_until(lambda: status(long) == Status.RUNNING, 30, "the first call to run")
        assert live_places(broker, queue, fx.owner.pk) == 1
        server.kill9()
        server.start()  # from the dump: the mark as it was, the running call's place gone
        assert broker.get(mark) == snapshot_mark
        assert live_places(broker, queue, fx.owner.pk) == 0
        later = submit_one(agents.start_session(agent=fx.agent), "list_directory", {"path": "."})
        assert broker.rpop(queue) is not None
        if seat:
            broker.delete(batches._fair_keys(queue)[0])
        execution.execute_turn(str(later.pk))
        # Before: the owner's next call ran at once, beside the first.
        assert status(later) == Status.QUEUED
        assert status(long) == Status.RUNNING
        assert broker.get(mark) != snapshot_mark  # (counted again, and marked anew)
    finally:
        Path(first_session.workspace, "go").touch()
        thread.join(30)
    assert not thread.is_alive()
    # Not held back for good: the first call's place is given back when it ends.
    assert live_places(broker, queue, fx.owner.pk) == 0
    while broker.rpop(queue) is not None:
        execution.execute_turn(str(later.pk))
    for call in (long, later):
        row = ToolCall.objects.get(pk=call.pk)
        assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    assert live_places(broker, queue, fx.owner.pk) == 0
