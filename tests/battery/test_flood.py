"""D9: one agent floods every door at once (asks past its cap, waits past its cap, new
sessions past their rate, a notification receiver that holds every delivery) while a
second agent's auto-allowed calls and a reviewer's queue are timed. The second agent's p95
stays within 2x its idle figure (issue 31); the flood meets its caps with answers it can
act on, and the other agent's ask is still in the reviewers' queue.

Sizes: `ci` 12 timed calls idle and under the flood; `full` 60 each, with a longer flood.
Real daphne, one Celery worker per lane (docs/operations.md), a private Redis, a real
webhook receiver on loopback (allowed by HARNESS_OUTBOUND_ALLOW).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from approvals.models import Channel
from tests.battery import figures
from tests.battery.conftest import FULL, reviewer_client, size
from tests.battery.live import clear_queue, native, start_session
from tests.battery.procs import Stack, wait_until
from tests.notifications import receivers
from tests.support.factories import make_agent, unique

TIMED = size(12, 60)
ASKS = size(60, 200)  # past HARNESS_MAX_PENDING_ASKS_PER_AGENT (set to 20 below)
WAITERS = size(12, 30)  # past HARNESS_MAX_WAITS_PER_AGENT (4 below)
SESSIONS = size(15, 40)  # past HARNESS_MAX_SESSIONS_PER_MINUTE (6 below)
PENDING_CAP, WAIT_CAP, SESSION_RATE = 20, 4, 6
# On a loaded 2-core machine (make test beside another run) a p95 of a few tens of ms
# moves by more than 2x on its own; `ci` adds this much to the bound, `full` gates at 2x.
CI_SLACK = 0.25


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def timed_calls(client: httpx.Client, session: str, prefix: str, n: int) -> list[float]:
    """`n` auto-allowed reads, one after another, each waited for: their latencies."""
    seconds = []
    for i in range(n):
        body = native(f"{prefix}{i}", "list_directory", {"path": "."})
        began = time.monotonic()
        response = client.post(f"/api/v1/sessions/{session}/calls?wait=30", json=body)
        seconds.append(time.monotonic() - began)
        assert response.status_code == 200, response.text[:300]
        call = response.json()["calls"][0]
        assert (call["status"], call["is_error"]) == ("completed", False), call
    return seconds


class Flood:
    """The flooding agent's threads and what each door answered."""

    def __init__(self, stack: Stack, url: str) -> None:
        self.stack, self.url = stack, url
        self.fx = make_agent(mode="standard")
        self.answers: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def note(self, what: str) -> None:
        with self.lock:
            self.answers[what] += 1

    def start(self) -> None:
        with self.stack.agent_client(self.url, self.fx.headers) as client:
            self.session = start_session(client, "flood")["id"]
        for target in (self.asks, self.sessions, *[self.wait] * WAITERS):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self.threads.append(thread)

    def asks(self) -> None:
        with self.stack.agent_client(self.url, self.fx.headers) as client:
            for i in range(0, ASKS, 10):
                calls = [
                    {
                        "id": f"w{j}",
                        "name": "write_file",
                        "arguments": {"path": f"f{j}", "content": "x"},
                    }
                    for j in range(i, i + 10)
                ]
                response = client.post(
                    f"/api/v1/sessions/{self.session}/calls", json={"calls": calls}
                )
                for call in response.json()["calls"]:
                    self.note(f"ask:{call['status']}")

    def wait(self) -> None:
        with self.stack.agent_client(self.url, self.fx.headers, timeout=60) as client:
            body = native("w0", "write_file", {"path": "f0", "content": "x"})
            response = client.post(f"/api/v1/sessions/{self.session}/calls?wait=20", json=body)
            self.note(f"wait:{response.status_code}")

    def sessions(self) -> None:
        with self.stack.agent_client(self.url, self.fx.headers) as client:
            for _ in range(SESSIONS):
                response = client.post("/api/v1/sessions", json={"title": "flood"})
                self.note(f"session:{response.status_code}")

    def join(self) -> None:
        for thread in self.threads:
            thread.join(90)


@pytest.mark.timeout(600)
def test_d9_one_agent_flooding_every_door_leaves_another_agent_its_pace(stack: Stack) -> None:
    release = threading.Event()

    def hold(server: receivers.Server, received: receivers.Received) -> tuple[int, bytes]:
        server.received.append(received)
        release.wait(60)  # a slow relay: every delivery holds a background worker
        return 200, b"{}"

    stack.env.update(
        HARNESS_MAX_PENDING_ASKS_PER_AGENT=str(PENDING_CAP),
        HARNESS_MAX_WAITS_PER_AGENT=str(WAIT_CAP),
        HARNESS_MAX_SESSIONS_PER_MINUTE=str(SESSION_RATE),
        HARNESS_OUTBOUND_ALLOW="127.0.0.1",
        HARNESS_OUTBOUND_TIMEOUT="60",
    )
    clear_queue()
    with receivers.http_server(hold) as receiver:
        channel = Channel.objects.create(
            name=unique("flood"), kind="webhook", config={"url": receiver.url, "secret": "s" * 32}
        )
        try:
            url = stack.daphne()
            stack.worker(concurrency=1, queues=stack.env["HARNESS_CELERY_BACKGROUND_QUEUE"])
            stack.worker(concurrency=2, queues=stack.env["HARNESS_CELERY_QUEUE"])
            run_row(stack, url, receiver)
        finally:
            release.set()
            Channel.objects.filter(pk=channel.pk).update(enabled=False)


def run_row(stack: Stack, url: str, receiver: Any) -> None:
    victim = make_agent(mode="standard")
    asker = make_agent(mode="standard")
    with stack.agent_client(url, victim.headers, timeout=60) as client:
        session = start_session(client, "victim")["id"]
        timed_calls(client, session, "warm", 3)
        idle = timed_calls(client, session, "idle", TIMED)

        flood = Flood(stack, url)
        flood.start()
        wait_until(lambda: len(receiver.received) >= 1, 60, "a delivery held by the receiver")
        wait_until(lambda: flood.answers["ask:denied"] >= 1, 60, "the pending-asks cap reached")
        with stack.agent_client(url, asker.headers) as other:
            other_session = start_session(other, "other asker")["id"]
            asked = other.post(
                f"/api/v1/sessions/{other_session}/calls",
                json=native("mine", "write_file", {"path": "other-agent.txt", "content": "y"}),
            )
        assert asked.json()["calls"][0]["status"] == "pending_approval", asked.text[:300]
        loaded = timed_calls(client, session, "loaded", TIMED)
        reviewer = reviewer_client(url)  # (signed in: already open)
        try:
            began = time.monotonic()
            queue = reviewer.get("/approvals/")
            queue_seconds = time.monotonic() - began
        finally:
            reviewer.close()
        flood.join()

    idle_p95, loaded_p95 = p95(idle), p95(loaded)
    bound = 2 * idle_p95 + (0 if FULL else CI_SLACK)
    figures.record("D9", "idle p95 of the other agent's call (s)", round(idle_p95, 4), "-", True)
    passed = figures.record(
        "D9",
        "flooded p95 of the other agent's call (s)",
        round(loaded_p95, 4),
        f"<= 2x idle ({bound:.3f})",
        loaded_p95 <= bound,
    )
    figures.record(
        "D9",
        "reviewer queue under the flood (s)",
        round(queue_seconds, 3),
        "< 2",
        queue_seconds < 2,
    )
    answers = dict(flood.answers)
    print(f"D9 flood answers: {answers}")
    assert passed, (idle, loaded)
    assert queue.status_code == 200 and "other-agent.txt" in queue.text
    assert queue_seconds < 2
    # Each door answered past its cap with something the agent can act on.
    assert answers.get("ask:pending_approval", 0) <= PENDING_CAP
    assert answers.get("ask:denied", 0) >= ASKS - PENDING_CAP - WAITERS
    assert answers.get("wait:429", 0) >= 1
    assert answers.get("session:429", 0) >= SESSIONS - SESSION_RATE
