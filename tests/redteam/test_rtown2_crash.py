"""rtown2: a worker's pool process killed (SIGKILL) between its take of a turn (the call
taken off its agent's list) and its claim of the call. The message was acknowledged and
the call is listed nowhere: the reconciler's re-send lists it again, and it runs once;
the calls queued behind it, of the same agent and another person's, run once each, and
nothing is left listed."""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.db import connection, transaction

from dispatcher.models import Status, ToolCall
from floor.redis_clients import redis_at
from tests.battery.live import start_session, started_counts, wait_terminal
from tests.battery.procs import Stack, wait_until
from tests.redteam.test_rtown_queue import send, stack
from tests.support.factories import make_agent

__all__ = ["stack"]


def _blocked_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # read anew, in the transaction
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database() AND pid <> pg_backend_pid()"
        )
        return bool(cursor.fetchone()[0])


@pytest.mark.live
@pytest.mark.timeout(180)
def test_a_worker_killed_between_its_take_and_its_claim(stack: Stack) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("holds the worker's read with a PostgreSQL table lock")
    url = stack.daphne()
    worker = stack.worker(1)
    stack.beat()  # the reconciler: every second, re-sending calls queued 3 s
    mine, theirs = make_agent(mode="trusted"), make_agent(mode="trusted")
    wait_until(lambda: len(worker.children()) == 1, 30, "the pool process")
    [child] = worker.children()
    os.kill(child, signal.SIGSTOP)  # nothing taken until the claim can be held
    with (
        stack.agent_client(url, mine.headers) as me,
        stack.agent_client(url, theirs.headers) as other,
    ):
        first = send(me, start_session(me)["id"], "first", 0)
        later = send(me, start_session(me)["id"], "later", 0)
        another = send(other, start_session(other)["id"], "another", 0)
    ids = [first, later, another]
    queue = stack.env["HARNESS_CELERY_QUEUE"]
    broker = redis_at(stack.redis.url)
    with transaction.atomic():
        with connection.cursor() as cursor:  # the worker's first read of the call waits
            cursor.execute("LOCK TABLE dispatcher_toolcall IN ACCESS EXCLUSIVE MODE")
        os.kill(child, signal.SIGCONT)
        wait_until(_blocked_on_a_lock, 30, "the worker to read the call it took")
        os.kill(child, signal.SIGKILL)
    # The call it took (the first: its agent's, and its owner's turn came first) is queued
    # and listed nowhere; the reconciler lists it again.
    assert ToolCall.objects.get(pk=first).status == Status.QUEUED
    began = time.monotonic()
    left = wait_terminal(ids, 60)
    assert not left, [(c.pk, c.status) for c in left]
    print(f"all ran {time.monotonic() - began:.1f}s after the kill")
    assert set(ToolCall.objects.filter(pk__in=ids).values_list("status", flat=True)) == {
        Status.COMPLETED
    }
    assert started_counts(ids) == {first: 1, later: 1, another: 1}
    wait_until(lambda: broker.llen(queue) == 0, 30, "the queue to drain")
    assert not list(broker.scan_iter(f"{queue}:fair:*"))
