"""rtcap3: the running cap under a Redis restarted empty and a worker killed with -9 while
two people's calls run, on a real daphne, a Celery worker of three processes, the beat's
reconciler and a cap of one call per person. Each person's calls run until the test lets
them end. A sampler reads the database every few milliseconds: is a person ever seen with
two calls running at once (a call killed with its worker counts until its lease ends,
when its place lapses)? Is any call lost (left queued) or run twice?

A live chaos run of about a minute: `make battery` runs it (marked slow, so `make test`
does not). It passed on the code before the running sets were counted again too (see
below); tests/dispatcher/test_rtcap3_restart.py and test_rtcap4_claim_window.py show
the takes that ran one over the cap."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connections
from django.utils import timezone

from dispatcher.models import Status, ToolCall
from floor.redis_clients import redis_at
from tests.battery import figures
from tests.battery.live import native, start_session, started_counts, wait_terminal
from tests.battery.procs import ProcessGroup, RedisServer, Stack, wait_until
from tests.dispatcher.test_runcap_tools import EXTRA_TOOLS
from tests.support.factories import make_agent

CALLS = 4  # of each person, each in a session of its own


@pytest.fixture
def cap_stack(procs: ProcessGroup, redis_server: RedisServer, battery_db: None) -> Stack:
    return Stack(
        procs,
        redis_server,
        HARNESS_EXTRA_TOOLS=EXTRA_TOOLS,
        HARNESS_LEASE_GRACE="2",
        HARNESS_MAX_RUNNING_PER_OWNER="1",
    )


class Sampler(threading.Thread):
    """The most calls of one person seen running at once (a running call whose lease
    ended is not running: its worker is dead and its place lapsed)."""

    def __init__(self, owners: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.owners, self.most, self.samples = owners, 0, 0
        self.done = threading.Event()

    def run(self) -> None:
        try:
            while not self.done.is_set():
                rows = ToolCall.objects.filter(
                    pk__in=list(self.owners), status=Status.RUNNING, lease_until__gt=timezone.now()
                ).values_list("pk", flat=True)
                per = Counter(self.owners[str(pk)] for pk in rows)
                self.most = max(self.most, *per.values(), 0)
                self.samples += 1
                time.sleep(0.005)
        finally:
            connections.close_all()


def running(ids: list[str]) -> int:
    return ToolCall.objects.filter(pk__in=ids, status=Status.RUNNING).count()


@pytest.mark.live
@pytest.mark.slow  # (about a minute: `make battery` runs it, `make test` does not)
@pytest.mark.timeout(400)
def test_a_redis_restart_and_a_killed_worker_keep_the_cap_and_lose_no_call(
    cap_stack: Stack,
) -> None:
    stack = cap_stack
    url = stack.daphne()
    worker = stack.worker(3)
    stack.beat()
    people = [make_agent(mode="trusted"), make_agent(mode="trusted")]
    owners: dict[str, int] = {}
    workspaces: list[Path] = []
    for fx in people:
        with stack.agent_client(url, fx.headers) as client:
            for i in range(CALLS):
                session = start_session(client)
                workspaces.append(Path(session["workspace"]))
                response = client.post(
                    f"/api/v1/sessions/{session['id']}/calls",
                    json=native(f"c{i}", "runcap_wait_for", {"path": "go"}),
                )
                assert response.status_code in (200, 202), response.text[:300]
                owners[str(response.json()["calls"][0]["id"])] = fx.owner.pk
    ids = list(owners)
    sampler = Sampler(owners)
    sampler.start()
    try:
        wait_until(lambda: running(ids) == 2, 60, "one call of each person to run")
        stack.redis.kill9()
        stack.redis.start()  # empty: every list, message and place lost
        restarted = timezone.now()
        broker = redis_at(stack.redis.url)
        queue = stack.env["HARNESS_CELERY_QUEUE"]

        def resent_and_taken() -> bool:
            waiting = ToolCall.objects.filter(pk__in=ids, status=Status.QUEUED)
            return (
                not waiting.filter(enqueued_at__lt=restarted).exists() and broker.llen(queue) == 0
            )

        # The reconciler re-sends the queued calls (after 3 s) and the worker takes them.
        wait_until(resent_and_taken, 90, "the queued calls to be sent again and taken")
        time.sleep(1)
        # (This held on the code before the running sets were counted again too, for a
        # reason not found; tests/dispatcher/test_rtcap3_restart.py shows the take that
        # ran one over there.)
        assert running(ids) == 2, "a person's queued call started after Redis restarted"
        # Each person's running call ends (or ended at its tool's timeout meanwhile):
        # their next one runs.
        for call in ToolCall.objects.select_related("session").filter(
            pk__in=ids, status=Status.RUNNING
        ):
            Path(call.session.workspace, "go").touch()
        wait_until(
            lambda: (
                running(ids) == 2
                and ToolCall.objects.filter(pk__in=ids, status=Status.COMPLETED).count() >= 2
            ),
            90,
            "each person's next call to run",
        )
        worker.kill9()  # its process and pool, holding both running calls
        stack.worker(3)
        time.sleep(4)
        for path in workspaces:
            (path / "go").touch()
        left = wait_terminal(ids, 150)
    finally:
        for path in workspaces:
            (path / "go").touch()
        sampler.done.set()
        sampler.join(10)
    assert not left, f"{len(left)} calls unfinished: {[c.status for c in left]}"
    statuses = Counter(ToolCall.objects.filter(pk__in=ids).values_list("status", flat=True))
    print(f"statuses {dict(statuses)}, {sampler.samples} samples, most at once {sampler.most}")
    figures.record(
        "cap",
        "most calls of one person running at once (cap of one; Redis restarted, worker -9)",
        sampler.most,
        "1",
        sampler.most == 1,
        samples=sampler.samples,
    )
    assert sampler.most == 1, "two calls of one person ran at once"
    # (the calls the killed worker ran end outcome_unknown: two, unless one ended first)
    assert set(statuses) <= {Status.COMPLETED, Status.OUTCOME_UNKNOWN}, statuses
    assert statuses[Status.OUTCOME_UNKNOWN] <= 2, statuses
    assert set(started_counts(ids).values()) == {1}  # none run twice
    assert {c.attempts for c in ToolCall.objects.filter(pk__in=ids)} == {1}
