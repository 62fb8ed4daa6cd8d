"""rtcap3: the running cap counts each owner's running calls in Redis only. A Redis that
restarted empty (the embedded one keeps nothing on disk) or was flushed while a call ran
forgot its place: the owner's next call found no place taken and started beside it, two
of one person's calls at once under a cap of one, until the first ended. Now the sets are
marked as counting every running call; a take or hold finding the mark gone counts the
calls the database has running on the workers first, and the worker that runs one of
those gives its place back when it ends."""

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
def test_redis_restarted_while_a_call_runs_starts_no_other_call_of_its_owner(
    own_cap_lane: tuple[RedisServer, str], seat: bool
) -> None:
    """`seat`: the owner's next call comes by a message that finds the ring empty (its
    place is taken at its hold), not by its take."""
    server, queue = own_cap_lane
    broker = redis_at(server.url)
    fx = make_agent(mode="trusted")
    first_session = agents.start_session(agent=fx.agent)
    long = submit_one(first_session, "runcap_wait_for", {"path": "go"})
    assert broker.rpop(queue) is not None  # (its message, sent after commit)
    thread = worker(lambda: execution.execute_turn(str(long.pk)))
    try:
        wait_until(lambda: status(long) == Status.RUNNING, 30, "the first call to run")
        server.kill9()
        server.start()  # empty: every place forgotten
        later = submit_one(agents.start_session(agent=fx.agent), "list_directory", {"path": "."})
        assert broker.rpop(queue) is not None
        if seat:
            broker.delete(batches._fair_keys(queue)[0])
        execution.execute_turn(str(later.pk))
        # Before: the owner's next call ran at once, beside the first.
        assert status(later) == Status.QUEUED
        assert status(long) == Status.RUNNING
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
