"""What the running cap's tests (tests/dispatcher/test_runcap*.py, test_rtcap*.py) share
besides their fixtures (tests/dispatcher/conftest.py): a call's status now, an owner's
live places in Redis, a worker process's thread, and a worker's turn run."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

from django.db import connections

from dispatcher import batches, execution
from dispatcher.models import Status, ToolCall


def status(call: ToolCall) -> str:
    return str(ToolCall.objects.get(pk=call.pk).status)


def mark_counted(broker: Any, queue: str) -> None:
    """The running sets of `queue` marked counted by this Redis process (a queue of the
    test's own: nothing runs yet), as `batches.count_running` marks them: its run_id and a
    generation (a mark without this process's run_id is counted again)."""
    run_id = broker.info("server")["run_id"]
    broker.set(batches._counted_key(queue), f"{run_id}:{uuid.uuid4().hex}")


def live_places(broker: Any, queue: str, owner: int) -> int:
    """The owner's places among running calls that have not lapsed."""
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


def run_turn(turn: batches.Turn) -> None:
    """What execution.execute_turn does with a turn already taken."""
    try:
        execution.execute_call(turn.call_id, turn=turn)
    finally:
        batches.end_turn(turn)


def each_ran_once_after(
    broker: Any, queue: str, owner: int, long: ToolCall, later: ToolCall
) -> None:
    """Once the owner's `long` call ended (its worker's thread joined): not held back for
    good, its place is given back, and `later`, left queued at the cap, runs at its
    message's re-send; each ran once, and no place is left."""
    assert live_places(broker, queue, owner) == 0
    while broker.rpop(queue) is not None:
        execution.execute_turn(str(later.pk))
    for call in (long, later):
        row = ToolCall.objects.get(pk=call.pk)
        assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    assert live_places(broker, queue, owner) == 0
