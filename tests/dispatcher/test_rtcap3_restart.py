"""rtcap3: the running cap counts each owner's running calls in Redis only. A Redis that
restarted empty (the embedded one keeps nothing on disk) or was flushed while a call ran
forgot its place: the owner's next call found no place taken and started beside it, two
of one person's calls at once under a cap of one, until the first ended. Now the sets are
marked as counting every running call; a take or hold finding the mark gone counts the
calls the database has running on the workers first, and the worker that runs one of
those gives its place back when it ends.

sock: a Redis that came back from an older snapshot (a restart that loaded its dump, a
backup restored, a lagging replica promoted) brought the mark back with the sets of that
moment: no recount, and the calls started since had no place, so the owner's next call
started beside a running one, past the cap. The mark now names the Redis process that
set it (its run_id, new at every start): one brought back by a snapshot is no mark, and
the places are counted again first."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from dispatcher import agents, batches, execution
from dispatcher.models import Status, ToolCall
from floor.redis_clients import redis_at
from tests.battery.procs import RedisServer, wait_until
from tests.support.factories import make_agent, submit_one
from tests.support.running_cap import each_ran_once_after, live_places, status, worker


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("seat", [False, True])
@pytest.mark.parametrize("snapshot", [False, True])
def test_redis_restarted_while_a_call_runs_starts_no_other_call_of_its_owner(
    own_cap_lane: tuple[RedisServer, str], seat: bool, snapshot: bool
) -> None:
    """`seat`: the owner's next call comes by a message that finds the ring empty (its
    place is taken at its hold), not by its take. `snapshot`: Redis comes back from a dump
    saved before the first call started (its places counted and marked then), not
    empty."""
    server, queue = own_cap_lane
    broker = redis_at(server.url)
    mark = batches._counted_key(queue)
    fx = make_agent(mode="trusted")
    if snapshot:
        batches.count_running(server.url, queue)  # (what the first take does)
        broker.save()  # the mark, and no place of the owner's
    before = broker.get(mark)
    first_session = agents.start_session(agent=fx.agent)
    long = submit_one(first_session, "runcap_wait_for", {"path": "go"})
    assert broker.rpop(queue) is not None  # (its message, sent after commit)
    thread = worker(lambda: execution.execute_turn(str(long.pk)))
    try:
        wait_until(lambda: status(long) == Status.RUNNING, 30, "the first call to run")
        server.kill9()
        server.start()  # empty, or as saved: either way the running call's place is gone
        assert broker.get(mark) == before
        assert live_places(broker, queue, fx.owner.pk) == 0
        later = submit_one(agents.start_session(agent=fx.agent), "list_directory", {"path": "."})
        assert broker.rpop(queue) is not None
        if seat:
            broker.delete(batches._fair_keys(queue)[0])
        execution.execute_turn(str(later.pk))
        # Before: the owner's next call ran at once, beside the first.
        assert status(later) == Status.QUEUED
        assert status(long) == Status.RUNNING
        assert broker.get(mark) not in (None, before)  # (counted again, marked anew)
    finally:
        Path(first_session.workspace, "go").touch()
        thread.join(30)
    assert not thread.is_alive()
    each_ran_once_after(broker, queue, fx.owner.pk, long, later)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180)
def test_a_snapshot_that_kept_a_turns_place_still_counts_the_calls_started_since(
    own_cap_lane: tuple[RedisServer, str], settings: Any
) -> None:
    """sock: the snapshot held a running call's turn's place, which once told the count
    that the owner's set was not lost (only its mark could have been) and had it add
    nothing: the calls started after the snapshot stayed uncounted. A mark of another
    Redis process now has every set given its places."""
    settings.HARNESS_MAX_RUNNING_PER_OWNER = "2"
    server, queue = own_cap_lane
    broker = redis_at(server.url)
    fx = make_agent(mode="trusted")
    sessions = [agents.start_session(agent=fx.agent) for _ in range(2)]
    threads = []
    try:
        for n, session in enumerate(sessions):
            call = submit_one(session, "runcap_wait_for", {"path": "go"})
            assert broker.rpop(queue) is not None
            threads.append(worker(functools.partial(execution.execute_turn, str(call.pk))))
            wait_until(functools.partial(running, call), 30, "a call to run")
            if n == 0:
                broker.save()  # the mark, and the first call's turn's place
        server.kill9()
        server.start()  # as saved: the second call's place is gone
        assert live_places(broker, queue, fx.owner.pk) == 1
        later = submit_one(agents.start_session(agent=fx.agent), "list_directory", {"path": "."})
        assert broker.rpop(queue) is not None
        execution.execute_turn(str(later.pk))
        # Before: the owner's third call ran beside the two, under a cap of two.
        assert status(later) == Status.QUEUED
    finally:
        for session in sessions:
            Path(session.workspace, "go").touch()
        for thread in threads:
            thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    assert live_places(broker, queue, fx.owner.pk) == 0
    while broker.rpop(queue) is not None:
        execution.execute_turn(str(later.pk))
    assert status(later) == Status.COMPLETED


def running(call: ToolCall) -> bool:
    return status(call) == Status.RUNNING
