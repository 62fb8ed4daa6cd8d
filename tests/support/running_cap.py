"""What the running cap's tests (tests/dispatcher/test_runcap*.py, test_rtcap*.py) share
besides their fixtures (tests/dispatcher/conftest.py): a call's status now, an owner's
live places in Redis, a worker process's thread, and a worker's turn run."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

from dispatcher import batches, execution
from dispatcher.models import ToolCall


def status(call: ToolCall) -> str:
    return str(ToolCall.objects.get(pk=call.pk).status)


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
