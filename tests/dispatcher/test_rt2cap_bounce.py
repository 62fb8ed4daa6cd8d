"""rt2cap: a call whose worker found its owner at the cap at the hold (Hold.AT_CAP) is sent
again at once (execution._send_again). Could it bounce between a worker's processes, each
finding the owner still at its cap, at full speed while the owner's long calls run, and
hold back another person's call meanwhile? Measured on a real worker of two processes
with a cap of one: one person's long call running, four more of theirs waiting, their
owners' ring lost (as with a Redis that lost it) and a message of no agent for each
waiting call (the path that takes a place at the hold, finds the cap, and sends again)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.db import connections

from dispatcher import batches
from dispatcher.models import Status, ToolCall
from floor import celery_message
from floor.redis_clients import redis_at
from tests.battery.live import native, start_session, wait_terminal
from tests.battery.procs import ProcessGroup, RedisServer, Stack, wait_until
from tests.dispatcher.test_runcap_tools import EXTRA_TOOLS
from tests.support.factories import make_agent


@pytest.fixture
def stack(tmp_path: Path, django_db_setup: None, django_db_blocker: Any) -> Iterator[Stack]:
    group = ProcessGroup(tmp_path)
    try:
        with django_db_blocker.unblock():
            yield Stack(
                group,
                RedisServer(group),
                HARNESS_EXTRA_TOOLS=EXTRA_TOOLS,
                HARNESS_LEASE_GRACE="2",
                HARNESS_MAX_RUNNING_PER_OWNER="1",
            )
            connections.close_all()
    finally:
        group.stop_all()


def send(client: Any, session: str, tool_use_id: str, name: str, args: dict[str, Any]) -> str:
    response = client.post(
        f"/api/v1/sessions/{session}/calls", json=native(tool_use_id, name, args)
    )
    assert response.status_code in (200, 202), response.text[:300]
    return str(response.json()["calls"][0]["id"])


def scripts_run(broker: Any) -> int:
    """Scripts the broker's Redis has run so far (each take, hold, give-back, push)."""
    stats = broker.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def cpu_seconds(worker: Any) -> float:
    parent = psutil.Process(worker.pid)
    total = 0.0
    for proc in [parent, *parent.children(recursive=True)]:
        times = proc.cpu_times()
        total += times.user + times.system
    return total


@pytest.mark.live
@pytest.mark.timeout(300)
def test_a_call_sent_again_at_the_cap_does_not_bounce_nor_hold_back_another_person(
    stack: Stack,
) -> None:
    url = stack.daphne()
    worker = stack.worker(2)
    stack.beat()
    queue = stack.env["HARNESS_CELERY_QUEUE"]
    broker = redis_at(stack.redis.url)
    flooder, other = make_agent(mode="trusted"), make_agent(mode="trusted")
    with (
        stack.agent_client(url, flooder.headers) as a,
        stack.agent_client(url, other.headers, timeout=60) as b,
    ):
        sessions = [start_session(a) for _ in range(5)]
        ids = [
            send(a, s["id"], f"w{i}", "runcap_wait_for", {"path": "go"})
            for i, s in enumerate(sessions)
        ]
        try:
            wait_until(
                lambda: ToolCall.objects.filter(pk__in=ids, status=Status.RUNNING).count() == 1,
                60,
                "one call of the five to run",
            )
            waiting = [
                str(pk)
                for pk in ToolCall.objects.filter(pk__in=ids, status=Status.QUEUED).values_list(
                    "pk", flat=True
                )
            ]
            assert len(waiting) == 4
            # The owners' ring lost, and a message of no agent for each waiting call: each
            # finds the ring empty, takes no place at its hold (the owner is at its cap),
            # and is sent again.
            broker.delete(batches._fair_keys(queue)[0])
            for call_id in waiting:
                message = celery_message.task_message(batches.EXECUTE_TASK, call_id, queue)
                broker.lpush(queue, message)
            wait_until(lambda: broker.llen(queue) == 0, 30, "the messages to be taken")
            scripts, cpu, began = scripts_run(broker), cpu_seconds(worker), time.monotonic()
            time.sleep(6)
            elapsed = time.monotonic() - began
            rate = (scripts_run(broker) - scripts) / elapsed
            load = (cpu_seconds(worker) - cpu) / elapsed
            print(f"while at the cap: {rate:.1f} scripts/s, worker CPU {load:.0%}")
            # Another person's call answers at once meanwhile.
            began = time.monotonic()
            answer = b.post(
                f"/api/v1/sessions/{start_session(b)['id']}/calls?wait=15",
                json=native("b", "list_directory", {"path": "."}),
            )
            waited = time.monotonic() - began
            assert answer.status_code == 200, answer.text[:300]
            assert answer.json()["calls"][0]["status"] == "completed", answer.text[:300]
            assert waited < 10, waited
            assert rate < 20, rate  # (the reconciler's re-sends: a few a second)
            assert load < 0.5, load
            assert ToolCall.objects.filter(pk__in=ids, status=Status.RUNNING).count() == 1
        finally:
            for s in sessions:
                Path(s["workspace"], "go").touch()
    left = wait_terminal(ids, 120)
    assert not left, f"{len(left)} calls unfinished"
    calls = list(ToolCall.objects.filter(pk__in=ids).order_by("started_at"))
    assert {(c.status, c.attempts) for c in calls} == {(Status.COMPLETED, 1)}
    for earlier, later in zip(calls, calls[1:], strict=False):
        assert earlier.finished_at is not None and later.started_at is not None
        assert later.started_at >= earlier.finished_at, "two of one person's calls ran at once"
