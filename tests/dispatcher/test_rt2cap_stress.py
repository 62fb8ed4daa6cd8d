"""rt2cap: the places a take holds lapse before their hold (a grace far shorter than the
worker's path to its claim), so holds find their place gone and either take it again
below the cap or find the owner at the cap and send their call again. On a real worker
of two processes, a cap of one and two people's calls sent at once: is any call lost, run
twice, or run beside another of its owner's?"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from dispatcher import batches
from dispatcher.models import Status, ToolCall
from floor.redis_clients import redis_at
from tests.battery.live import native, start_session, started_counts, wait_terminal
from tests.battery.procs import ProcessGroup, RedisServer, Stack
from tests.dispatcher.test_runcap_tools import EXTRA_TOOLS
from tests.support.factories import make_agent

CALLS = 8  # of each person, each in a session of its own


@pytest.fixture
def stack(tmp_path: Path, django_db_setup: None, django_db_blocker: Any) -> Iterator[Stack]:
    group = ProcessGroup(tmp_path)
    try:
        with django_db_blocker.unblock():
            yield Stack(
                group,
                RedisServer(group),
                HARNESS_EXTRA_TOOLS=EXTRA_TOOLS,
                HARNESS_LEASE_GRACE="0.02",
                HARNESS_MAX_RUNNING_PER_OWNER="1",
            )
            connections.close_all()
    finally:
        group.stop_all()


@pytest.mark.live
@pytest.mark.timeout(300)
def test_places_lapsing_before_their_hold_lose_no_call_and_keep_the_cap(stack: Stack) -> None:
    url = stack.daphne()
    stack.worker(2)
    stack.beat()
    people = [make_agent(mode="trusted"), make_agent(mode="trusted")]
    ids: dict[int, list[str]] = {}
    for fx in people:
        with stack.agent_client(url, fx.headers) as client:
            sessions = [start_session(client) for _ in range(CALLS)]
            for s in sessions:
                Path(s["workspace"], "go").touch()  # (each call ends as soon as it runs)
            ids[fx.owner.pk] = []
            for i, s in enumerate(sessions):
                response = client.post(
                    f"/api/v1/sessions/{s['id']}/calls",
                    json=native(f"c{i}", "runcap_wait_for", {"path": "go"}),
                )
                assert response.status_code in (200, 202), response.text[:300]
                ids[fx.owner.pk].append(str(response.json()["calls"][0]["id"]))
    every = [pk for pks in ids.values() for pk in pks]
    left = wait_terminal(every, 180)
    assert not left, f"{len(left)} calls unfinished: {[c.status for c in left]}"
    rows = ToolCall.objects.filter(pk__in=every)
    assert {(c.status, c.attempts) for c in rows} == {(Status.COMPLETED, 1)}
    assert set(started_counts(every).values()) == {1}
    for owner, pks in ids.items():
        calls = list(ToolCall.objects.filter(pk__in=pks).order_by("started_at"))
        for earlier, later in zip(calls, calls[1:], strict=False):
            assert earlier.finished_at is not None and later.started_at is not None
            assert later.started_at >= earlier.finished_at, f"owner {owner}: two ran at once"
    broker = redis_at(stack.redis.url)
    queue = stack.env["HARNESS_CELERY_QUEUE"]
    assert not list(broker.scan_iter(f"{queue}:fair:calls:*"))
    for owner in ids:
        seconds, micro = broker.time()
        key = batches._running_key(queue, str(owner))
        assert broker.zcount(key, seconds + micro / 1e6, "+inf") == 0
