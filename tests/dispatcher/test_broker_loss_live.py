"""A Redis that dies while a worker holds messages it has not started yet.

The worker's prefetched messages are "unacknowledged" in kombu's Redis transport; when the
broker connection is lost, the consumer closes its channels and tries to put them back.
kombu 5.7 closes the transport first, so that restore raised AttributeError
("'NoneType' object has no attribute 'hostname'") and the worker's main process exited
("Unrecoverable error"): every call still queued waited for a worker that was gone (the
battery's C4 row: 56 of 60 calls left queued). The worker must survive the outage, and the
reconciler must then re-send what the dead Redis lost, each call running once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from dispatcher.models import TERMINAL_STATUSES, Status, ToolCall
from tests.battery.live import native, start_session, started_counts
from tests.battery.procs import ProcessGroup, RedisServer, Stack, wait_until
from tests.battery.tools import EXTRA_TOOLS
from tests.support.factories import make_agent

pytestmark = pytest.mark.live

# Two calls keep both pool processes busy and the worker holds the third (prefetched,
# unacknowledged) while it waits on Redis (BRPOP) for a fourth: the state in which the
# connection loss crashed the worker.
CALLS = 3


@pytest.fixture
def stack(tmp_path: Path, django_db_setup: None, django_db_blocker: Any) -> Iterator[Stack]:
    group = ProcessGroup(tmp_path)
    try:
        with django_db_blocker.unblock():
            # One person's calls fill both pool processes: no cap on its running calls
            # (by default one process of two is left for other people's calls).
            yield Stack(
                group,
                RedisServer(group),
                HARNESS_EXTRA_TOOLS=EXTRA_TOOLS,
                HARNESS_MAX_RUNNING_PER_OWNER="0",
            )
            connections.close_all()
    finally:
        group.stop_all()


@pytest.mark.timeout(240)
def test_a_worker_holding_prefetched_messages_survives_a_redis_crash(stack: Stack) -> None:
    url = stack.daphne()
    worker = stack.worker(2)
    stack.beat()
    fx = make_agent(mode="trusted")
    ids = []
    with stack.agent_client(url, fx.headers) as client:
        for n in range(CALLS):  # one session each: independent batches, run side by side
            session = start_session(client)
            body = native(f"m{n}", "battery_marker", {"path": "marker.txt", "delay": 2.5})
            response = client.post(f"/api/v1/sessions/{session['id']}/calls", json=body)
            assert response.status_code in (200, 202), response.text
            ids.append(response.json()["calls"][0]["id"])

    def running() -> bool:
        return ToolCall.objects.filter(pk__in=ids, status=Status.RUNNING).count() == 2

    # Both pool processes busy, the third message in the worker's hand, BRPOP pending.
    wait_until(running, 60, "two calls running", step=0.05)
    time.sleep(0.5)
    stack.redis.kill9()
    time.sleep(1)
    stack.redis.start()

    def settled() -> bool:
        log = worker.tail(1_000_000)
        return not worker.alive() or "Unrecoverable error" in log or log.count("Connected to") > 1

    wait_until(settled, 30, "the worker to reconnect or exit")
    assert "Unrecoverable error" not in worker.tail(1_000_000), worker.tail()
    assert worker.alive(), f"the worker exited after the broker connection loss:\n{worker.tail()}"

    def finished() -> bool:
        return not ToolCall.objects.filter(pk__in=ids).exclude(status__in=TERMINAL_STATUSES)

    wait_until(finished, 90, "every call to finish after the outage", step=0.25)
    statuses = dict(ToolCall.objects.filter(pk__in=ids).values_list("pk", "status"))
    assert set(statuses.values()) == {Status.COMPLETED}, statuses
    assert max(started_counts(ids).values()) == 1
    for call in ToolCall.objects.filter(pk__in=ids).select_related("session"):
        lines = Path(call.session.workspace, "marker.txt").read_text().splitlines()
        assert lines == [str(call.pk)], (call.pk, lines)
