"""D9: one agent floods every door at once, for as long as the timing lasts (asks past its
cap, waits past its cap, new sessions past their rate, requests as fast as its threads can
send them, a notification receiver that holds every delivery) while a second agent's
auto-allowed calls and a reviewer's queue are timed. The second agent's p95 stays within
2x its idle figure (issue 31): the caps bound what a flood holds, and the request rate
(HARNESS_AGENT_REQUESTS_PER_SECOND, on here as nowhere else in the battery) bounds how fast
it knocks, refusing the rest before admission. Every door answers with something the agent
can act on, the flooder gets no more than its rate, and the other agent's ask is still in
the reviewers' queue.

Sizes: `ci` 12 timed calls idle and under the flood; `full` 60 each.
Real daphne, one Celery worker per lane (docs/operations.md), a private Redis, a real
webhook receiver on loopback (allowed by HARNESS_OUTBOUND_ALLOW).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from approvals.models import Channel
from dispatcher import limits
from tests.battery import figures
from tests.battery.conftest import FULL, reviewer_client, size
from tests.battery.live import clear_queue, native, start_session
from tests.battery.procs import Stack, wait_until
from tests.notifications import receivers
from tests.support.factories import make_agent, unique

TIMED = size(12, 60)
WAITERS = size(12, 30)  # past HARNESS_MAX_WAITS_PER_AGENT (4 below)
KNOCKERS = 4  # threads sending requests back to back
PENDING_CAP, WAIT_CAP, SESSION_RATE = 20, 4, 6
RATE, BURST = 20, 60  # the defaults of HARNESS_AGENT_REQUESTS_PER_SECOND and _BURST
# The other agent's pace: a model's turn between two calls (it stays below RATE).
PACE = 0.1
# On a loaded 2-core machine (make test beside another run) a p95 of a few tens of ms
# moves by more than 2x on its own; `ci` adds this much to the bound, `full` gates at 2x.
CI_SLACK = 0.25


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def timed_calls(
    client: httpx.Client, session: str, prefix: str, n: int, sent: dict[str, float]
) -> list[float]:
    """`n` auto-allowed reads, one after another at PACE, each waited for: their latencies
    (and in `sent`, when each was sent, by its id)."""
    seconds = []
    for i in range(n):
        time.sleep(PACE)
        body = native(f"{prefix}{i}", "list_directory", {"path": "."})
        began = time.monotonic()
        sent[f"{prefix}{i}"] = time.time()
        response = client.post(f"/api/v1/sessions/{session}/calls?wait=30", json=body)
        seconds.append(time.monotonic() - began)
        assert response.status_code == 200, response.text[:300]
        call = response.json()["calls"][0]
        assert (call["status"], call["is_error"]) == ("completed", False), call
    return seconds


def code_of(response: httpx.Response) -> str:
    """The status, and for a refusal the error's code (`429:too_many_requests`)."""
    if response.status_code < 400:
        return str(response.status_code)
    try:
        return f"{response.status_code}:{response.json()['error']['code']}"
    except (ValueError, KeyError, TypeError):
        return str(response.status_code)


def print_slowest(session: str, loaded: list[float], sent: dict[str, float]) -> None:
    """Where the slowest flooded calls spent their time: in daphne before the call was
    stored, from stored to finished (admission, queue, run), and after it finished (the
    wake-up, the re-read, the answer)."""
    from dispatcher.models import ToolCall

    for seconds, i in sorted(((s, i) for i, s in enumerate(loaded)), reverse=True)[:5]:
        call = ToolCall.objects.get(session_id=session, tool_use_id=f"loaded{i}")
        before = call.created_at.timestamp() - sent[f"loaded{i}"]
        inside = (call.finished_at - call.created_at).total_seconds()
        print(
            f"D9 slow call at {sent[f'loaded{i}']:.3f}: {seconds:.3f} s = {before:.3f} before it was stored + "
            f"{inside:.3f} to finished + {seconds - before - inside:.3f} after"
        )


class Flood:
    """The flooding agent: its own process (as another machine would be: its threads do
    not compete with the timed client's), whose threads send until stopped; what each door
    answered, as the process last reported it."""

    def __init__(self, stack: Stack, url: str) -> None:
        self.stack, self.url = stack, url
        self.fx = make_agent(mode="standard")
        self.answers: Counter[str] = Counter()
        context = multiprocessing.get_context("fork")  # the child only speaks HTTP
        self.stopping = context.Event()
        self.reports: Any = context.Queue()
        self.process: Any = None
        self.reader = threading.Thread(target=self.read_reports, daemon=True)
        self.began = self.ended = 0.0

    def start(self) -> None:
        with self.stack.agent_client(self.url, self.fx.headers) as client:
            session = start_session(client, "flood")["id"]
        self.began = time.monotonic()
        self.process = multiprocessing.get_context("fork").Process(
            target=flood_process,
            args=(self.url, self.fx.headers, session, self.stopping, self.reports),
            daemon=True,
        )
        self.process.start()
        self.reader.start()

    def read_reports(self) -> None:
        while True:
            report = self.reports.get()
            if report is None:
                return
            self.answers = Counter(report)

    def stop(self) -> None:
        self.stopping.set()
        self.ended = time.monotonic()
        self.process.join(120)
        self.reader.join(30)

    def admitted(self) -> int:
        """Requests the rate let through (every request but those refused for the rate)."""
        return self.requests - self.answers["rate:refused"]

    @property
    def requests(self) -> int:
        return self.answers["rate:sent"]


def flood_process(
    url: str, headers: dict[str, str], session: str, stopping: Any, reports: Any
) -> None:
    """The flooding agent's process: asks, sessions, WAITERS waits and KNOCKERS requests
    back to back, each thread until `stopping`; reports its counts every 0.1 s and last."""
    answers: Counter[str] = Counter()
    lock = threading.Lock()

    def note(what: str) -> None:
        with lock:
            answers[what] += 1

    def sent(response: httpx.Response) -> httpx.Response:
        note("rate:sent")
        if code_of(response) == "429:too_many_requests":
            note("rate:refused")
            retry_after = response.headers.get("Retry-After", "")
            if not (retry_after.isdigit() and int(retry_after) >= 1):
                note("rate:no-retry-after")
        return response

    def client(timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=url, headers=headers, timeout=timeout)

    def asks() -> None:
        with client() as http:
            batch = 0
            while not stopping.is_set():
                calls = [
                    {
                        "id": f"w{j}",
                        "name": "write_file",
                        "arguments": {"path": f"f{j}", "content": "x"},
                    }
                    for j in range(batch * 10, batch * 10 + 10)
                ]
                response = sent(
                    http.post(f"/api/v1/sessions/{session}/calls", json={"calls": calls})
                )
                if response.status_code == 429:
                    note(f"ask:{code_of(response)}")
                    continue
                batch += 1
                for call in response.json()["calls"]:
                    note(f"ask:{call['status']}")

    def wait() -> None:
        with client(60) as http:
            body = native("w0", "write_file", {"path": "f0", "content": "x"})
            while not stopping.is_set():
                response = sent(http.post(f"/api/v1/sessions/{session}/calls?wait=20", json=body))
                note(f"wait:{code_of(response)}")

    def sessions() -> None:
        with client() as http:
            while not stopping.is_set():
                response = sent(http.post("/api/v1/sessions", json={"title": "flood"}))
                note(f"session:{code_of(response)}")

    def knock() -> None:
        with client() as http:
            while not stopping.is_set():
                note(f"knock:{code_of(sent(http.get('/api/v1/tools')))}")

    threads = [
        threading.Thread(target=target, daemon=True)
        for target in (asks, sessions, *[wait] * WAITERS, *[knock] * KNOCKERS)
    ]
    for thread in threads:
        thread.start()
    while not stopping.wait(0.1):
        with lock:
            reports.put(dict(answers))
    for thread in threads:
        thread.join(90)
    with lock:
        reports.put(dict(answers))
    reports.put(None)
    reports.close()
    reports.join_thread()


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
        HARNESS_AGENT_REQUESTS_PER_SECOND=str(RATE),
        HARNESS_AGENT_REQUEST_BURST=str(BURST),
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
    sent: dict[str, float] = {}
    with stack.agent_client(url, victim.headers, timeout=60) as client:
        session = start_session(client, "victim")["id"]
        timed_calls(client, session, "warm", 3, sent)
        idle = timed_calls(client, session, "idle", TIMED, sent)

        flood = Flood(stack, url)
        flood.start()
        try:
            wait_until(lambda: len(receiver.received) >= 1, 60, "a delivery held by the receiver")
            for what, reached in (
                ("ask:denied", "the pending-asks cap reached"),
                ("wait:429:too_many_waits", "the wait cap reached"),
                ("rate:refused", "the request rate reached"),
            ):
                wait_until(lambda what=what: flood.answers[what] >= 1, 60, reached)
            with stack.agent_client(url, asker.headers) as other:
                other_session = start_session(other, "other asker")["id"]
                asked = other.post(
                    f"/api/v1/sessions/{other_session}/calls",
                    json=native("mine", "write_file", {"path": "other-agent.txt", "content": "y"}),
                )
            assert asked.json()["calls"][0]["status"] == "pending_approval", asked.text[:300]
            loaded = timed_calls(client, session, "loaded", TIMED, sent)
            reviewer = reviewer_client(url)  # (signed in: already open)
            try:
                began = time.monotonic()
                queue = reviewer.get("/approvals/")
                queue_seconds = time.monotonic() - began
            finally:
                reviewer.close()
        finally:
            flood.stop()

    print_slowest(session, loaded, sent)
    idle_p95, loaded_p95 = p95(idle), p95(loaded)
    bound = 2 * idle_p95 + (0 if FULL else CI_SLACK)
    # A request held in the router when the flood is told to stop may still be let
    # through by the rate within one hold (dispatcher.limits.EARLY_HOLD): the flood's
    # share runs until then.
    seconds = flood.ended - flood.began + limits.EARLY_HOLD
    share = BURST + RATE * seconds
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
    figures.record(
        "D9",
        "flooder's requests sent / let through by its rate",
        f"{flood.requests} / {flood.admitted()} in {seconds:.1f} s",
        f"through <= {BURST} + {RATE}/s ({share:.0f})",
        flood.admitted() <= share,
    )
    answers = flood.answers
    print(f"D9 flood answers: {dict(answers)}")
    assert passed, (idle, loaded)
    assert queue.status_code == 200 and "other-agent.txt" in queue.text
    assert queue_seconds < 2
    # Each door answered past its cap with something the agent can act on, and the rate
    # let through no more than the burst plus its rate for the time the flood lasted.
    assert answers.get("ask:pending_approval", 0) <= PENDING_CAP
    assert flood.admitted() <= share, (flood.admitted(), share)
    assert answers["rate:refused"] >= 1
    assert answers["rate:no-retry-after"] == 0
    # (Behind the rate the session door is reached rarely: what it started stays in its cap.)
    minutes = int(seconds // 60) + 2  # the counter is per calendar minute
    assert answers["session:201"] <= SESSION_RATE * minutes
    sessions = {what for what in answers if what.startswith("session:")}
    assert sessions <= {
        "session:201",
        "session:429:too_many_sessions",
        "session:429:too_many_requests",
    }
