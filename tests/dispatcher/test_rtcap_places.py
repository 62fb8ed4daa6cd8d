"""rtcap: with a cap on each owner's running calls (HARNESS_MAX_RUNNING_PER_OWNER,
dispatcher.batches), a call could still run with no place among its owner's running calls.

A duplicate message of a call (the reconciler's re-send of a call still listed, a
redelivery) that found the owners' ring empty ran its own call with no place, while
another worker had taken the call with its place and not yet claimed it: that worker's
claim then failed and it gave its place back, so the call ran uncounted and the owner's
next call started beside it, one over the cap. And a take's place that lapsed before
its worker held it for the call's lease (a re-check or a workspace lock slower than the
grace) was put back by the hold whatever the owner's count: the cap had let another call
of the owner start meanwhile. Now a call runs only on a place its hold found (a message
finding the ring empty takes one for its own call's owner at the hold, within the cap),
else it stays queued and its worker sends it again, to wait for the owner's next place."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from dispatcher import agents, batches, execution
from dispatcher.models import Status, ToolCall
from tests.battery.procs import wait_until
from tests.support.factories import make_agent, submit_one
from tests.support.running_cap import live_places, run_turn, status, worker


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_duplicate_message_finding_the_ring_empty_runs_no_call_past_the_cap(
    cap_lane: tuple[Any, str],
) -> None:
    broker, queue = cap_lane
    fx = make_agent(mode="trusted")
    first_session = agents.start_session(agent=fx.agent)
    held = submit_one(first_session, "runcap_wait_for", {"path": "go"})
    assert held.status == Status.QUEUED
    share = batches.agent_of(held)  # (its message sent at admission, after commit)
    # A second message for it: the reconciler's re-send while it is still listed.
    batches.enqueue(str(held.pk), share, resend=True)
    assert broker.llen(queue) == 2
    threads: list[threading.Thread] = []
    try:
        # Worker A takes the call with its owner's one place, and has not claimed it yet ...
        assert broker.rpop(queue) is not None
        a_turn = batches.take_turn(str(held.pk))
        assert a_turn.call_id == str(held.pk) and a_turn.slot
        # ... when worker B takes the duplicate message: the ring is empty now.
        assert broker.rpop(queue) is not None
        threads.append(worker(lambda: execution.execute_turn(str(held.pk))))
        b = threads[-1]
        wait_until(lambda: not b.is_alive() or status(held) == Status.RUNNING, 30, "B's turn")
        threads.append(worker(lambda: run_turn(a_turn)))
        a = threads[-1]
        wait_until(lambda: status(held) == Status.RUNNING, 30, "the call to run")
        # Whichever worker does not run the call is done with it (its place given back).
        wait_until(lambda: not (a.is_alive() and b.is_alive()), 30, "the other worker")
        # The owner's next call, while the first runs: its take finds the owner at its cap.
        later = submit_one(agents.start_session(agent=fx.agent), "list_directory", {"path": "."})
        assert broker.rpop(queue) is not None
        execution.execute_turn(str(later.pk))
        # Before: the first call ran with no place (B's), A gave its place back when its
        # claim failed, and the second call started beside the first: two of one person's
        # calls at once under a cap of one.
        assert status(later) == Status.QUEUED
        assert status(held) == Status.RUNNING
        assert live_places(broker, queue, fx.owner.pk) == 1
    finally:
        Path(first_session.workspace, "go").touch()
        for thread in threads:
            thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    # Nothing lost: the first call's place given back sent the turn the second one was
    # owed (and B's give-back of the call it could not hold is one more message, that
    # finds the call done), and each ran once.
    while broker.rpop(queue) is not None:
        execution.execute_turn(batches.OWED_TURN)
    for call in (held, later):
        row = ToolCall.objects.get(pk=call.pk)
        assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    assert live_places(broker, queue, fx.owner.pk) == 0
    assert not list(broker.scan_iter(f"{queue}:fair:calls:*"))


def test_a_place_that_lapsed_before_its_hold_is_not_held_past_the_cap(
    cap_lane: tuple[Any, str], settings: Any
) -> None:
    broker, queue = cap_lane
    owner = batches.Share("7", str(uuid.uuid4()))
    batches.enqueue("a1", owner)
    batches.enqueue("a2", owner)
    settings.HARNESS_LEASE_GRACE = 0.05  # the take's place lapses before the claim
    assert broker.rpop(queue) is not None
    slow = batches.take_turn("message")
    assert slow.call_id == "a1" and slow.slot
    wait_until(lambda: live_places(broker, queue, 7) == 0, 5, "the place to lapse")
    assert broker.rpop(queue) is not None
    settings.HARNESS_LEASE_GRACE = 30.0
    quick = batches.take_turn("message")  # the owner's next call, in the lapsed place
    assert quick.call_id == "a2" and batches.hold(quick, 30)
    # Before: held anyway, two places of an owner capped at one (both calls ran). Now not
    # held: its worker sends the call again, to wait for the owner's next place.
    assert batches.hold(slow, 30) is batches.Hold.AT_CAP
    assert live_places(broker, queue, 7) == 1


@pytest.mark.django_db
def test_a_call_whose_place_lapsed_is_sent_again_at_once(
    cap_lane: tuple[Any, str], settings: Any
) -> None:
    """Its worker gives it back to its agent's turn (as for a busy workspace): left for the
    reconciler, it waited HARNESS_REQUEUE_AFTER (under load, a batch came back with one
    call still queued)."""
    broker, queue = cap_lane
    fx = make_agent(mode="trusted")
    calls = []
    for _ in range(2):
        call = submit_one(agents.start_session(agent=fx.agent), "list_directory", {"path": "."})
        batches.enqueue(str(call.pk), batches.agent_of(call))  # (admission's, after commit)
        calls.append(call)
    settings.HARNESS_LEASE_GRACE = 0.05
    assert broker.rpop(queue) is not None
    slow = batches.take_turn("message")
    assert slow.call_id == str(calls[0].pk)
    wait_until(lambda: live_places(broker, queue, fx.owner.pk) == 0, 5, "the place to lapse")
    settings.HARNESS_LEASE_GRACE = 1.0
    assert broker.rpop(queue) is not None
    quick = batches.take_turn("message")
    assert quick.call_id == str(calls[1].pk) and batches.hold(quick, 30)
    run_turn(slow)
    # Not run (its owner's one place is the other call's), and sent again at once.
    assert status(calls[0]) == Status.QUEUED and broker.llen(queue) == 1
    run_turn(quick)
    while broker.rpop(queue) is not None:
        execution.execute_turn("message")
    for call in calls:
        row = ToolCall.objects.get(pk=call.pk)
        assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    assert broker.llen(queue) == 0 and live_places(broker, queue, fx.owner.pk) == 0
