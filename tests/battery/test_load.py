"""D3: bounded load. Agents and reviewers for a fixed time against 2 daphne processes and
2 Celery workers (with beat) on one private Redis: agents submit calls that run, that are
denied and that ask, and poll them; reviewers read the queue from their own daphne and
approve what they see there, asks submitted through either daphne. Afterwards: failed
requests, p95 submit and approve, every session's chain verified, nothing stuck, nothing
run twice.

Sizes: `ci` 10 agents and 2 reviewers for 20 s (1 pool process per worker); `full` 50
agents and 5 reviewers for 5 minutes (2 per worker). Each agent waits 0.5 to 1.5 s between
requests (Locust's `between(0.5, 1.5)`), so the load is bounded, as the design asks.
"""

from __future__ import annotations

import functools
import random
import re
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from approvals.models import ApprovalRequest
from audit.verify import verify_database
from dispatcher.models import TERMINAL_STATUSES, Status, ToolCall
from tests.approvals.conftest import closing_connections
from tests.battery import figures
from tests.battery.conftest import FULL, reviewer_client, seed_for, size
from tests.battery.live import clear_queue, native, start_session, started_counts
from tests.battery.procs import Stack
from tests.battery.tools import EXTRA_TOOLS
from tests.support.factories import make_agent

AGENTS = size(10, 50)
REVIEWERS = size(2, 5)
SECONDS = size(10, 300)
SETTLE = 60
# p95 gates: the design's first guesses for a 2-core box, "calibrate them on the first
# green run, then gate on regressions (+20%)". The first green full-size run plus 20% came
# out about at these values, which stay the gates; docs/reliability.md keeps that
# calibration run and its figures.
P95_SUBMIT = 0.25
P95_APPROVE = 0.30
FORM = re.compile(r'action="/approvals/(\d+)/decide".*?name="digest" value="([0-9a-f]{64})"', re.S)


def p95(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.failures: list[str] = []
        self.submit: list[float] = []
        self.approve: list[float] = []
        self.via: dict[str, int] = {}  # call id -> index of the daphne it was submitted to
        self.decided: dict[str, int] = {}  # approval pk -> index of the reviewer's daphne
        self.conflicts = 0

    def fail(self, what: str) -> None:
        with self.lock:
            self.failures.append(what[:300])


@pytest.mark.timeout(SECONDS + 600)
def test_d3_bounded_load_on_two_daphnes_and_two_workers(stack: Stack) -> None:
    rng = random.Random(seed_for("D3"))
    stack.env["HARNESS_EXTRA_TOOLS"] = EXTRA_TOOLS
    urls = [stack.daphne(), stack.daphne()]
    for _ in range(2):
        stack.worker(2 if FULL else 1)
    stack.beat()
    clear_queue()
    tally = Tally()
    stop = threading.Event()
    sessions: list[str] = []

    # Made here: a thread of the test that touched the database would hold one of the
    # process's pooled connections to the end.
    fixtures = [make_agent(mode="standard") for _ in range(AGENTS)]

    def agent(index: int, seed: int) -> None:
        own = random.Random(seed)
        via = index % 2
        fx = fixtures[index]
        with httpx.Client(base_url=urls[via], headers=fx.headers, timeout=30) as client:
            session = start_session(client, f"load {index}")
            with tally.lock:
                sessions.append(session["id"])
            (Path(session["workspace"]) / "notes.txt").write_text("hi\n")
            mine: list[str] = []
            n = 0
            while not stop.is_set():
                n += 1
                roll = own.random()
                if roll < 0.25 and mine:
                    op, started = "poll", time.monotonic()
                    try:
                        response = client.get(f"/api/v1/calls/{own.choice(mine)}")
                        ok = response.status_code == 200
                    except httpx.HTTPError as error:
                        response, ok = None, False
                        tally.fail(f"poll: {error!r}")
                else:
                    name, args = (
                        ("read_file", {"path": "notes.txt"})  # runs
                        if roll < 0.55
                        else ("read_file", {"path": "../../etc/passwd"})  # denied
                        if roll < 0.7
                        else ("write_file", {"path": f"w{n}.txt", "content": f"{n}\n"})  # asks
                    )
                    op, started = "submit", time.monotonic()
                    try:
                        response = client.post(
                            f"/api/v1/sessions/{session['id']}/calls",
                            json=native(f"c{n}", name, args),
                        )
                        ok = response.status_code in (200, 202)
                    except httpx.HTTPError as error:
                        response, ok = None, False
                        tally.fail(f"submit: {error!r}")
                    if ok and response is not None:
                        call_id = response.json()["calls"][0]["id"]
                        mine.append(call_id)
                        with tally.lock:
                            tally.via[call_id] = via
                            tally.submit.append(time.monotonic() - started)
                with tally.lock:
                    tally.requests[op] += 1
                if response is not None and not ok:
                    tally.fail(f"{op}: {response.status_code} {response.text[:200]}")
                stop.wait(own.uniform(0.5, 1.5))

    def reviewer(index: int, seed: int) -> None:
        own = random.Random(seed)
        via = index % 2
        client = reviewer_client(urls[via])
        try:
            while not stop.is_set():
                try:
                    page = client.get("/approvals/")
                except httpx.HTTPError as error:
                    tally.fail(f"queue: {error!r}")
                    continue
                with tally.lock:
                    tally.requests["queue"] += 1
                if page.status_code != 200:
                    tally.fail(f"queue: {page.status_code}")
                forms = list(dict(FORM.findall(page.text)).items())
                own.shuffle(forms)
                for pk, digest in forms[:3]:
                    started = time.monotonic()
                    try:
                        response = client.post(
                            f"/approvals/{pk}/decide", data={"action": "approve", "digest": digest}
                        )
                    except httpx.HTTPError as error:
                        tally.fail(f"approve: {error!r}")
                        continue
                    with tally.lock:
                        tally.requests["approve"] += 1
                        if response.status_code == 200:
                            tally.approve.append(time.monotonic() - started)
                            tally.decided[pk] = via
                        elif response.status_code == 409:  # another reviewer was first
                            tally.conflicts += 1
                        else:
                            tally.failures.append(f"approve: {response.status_code}")
                stop.wait(own.uniform(0.5, 1.5))
        finally:
            client.close()

    # (each reviewer signs in from its thread: a user row made there, its connection
    # closed when the thread ends)
    threads = [
        threading.Thread(target=agent, args=(i, rng.randrange(2**32)), daemon=True)
        for i in range(AGENTS)
    ] + [
        threading.Thread(
            target=closing_connections(functools.partial(reviewer, i, rng.randrange(2**32))),
            daemon=True,
        )
        for i in range(REVIEWERS)
    ]
    for thread in threads:
        thread.start()
    time.sleep(SECONDS)
    stop.set()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads), "a load thread did not stop"

    calls = ToolCall.objects.filter(session_id__in=sessions)
    ids = [str(i) for i in calls.values_list("pk", flat=True)]
    deadline = time.monotonic() + SETTLE
    while time.monotonic() < deadline and _stuck(ids):
        time.sleep(0.5)
    stuck = _stuck(ids)
    starts = started_counts(ids)
    twice = [cid for cid, n in starts.items() if n > 1]
    bad_chains = [sid for sid in sessions if not verify_database(sid).ok]
    call_of = dict(
        ApprovalRequest.objects.filter(pk__in=list(tally.decided)).values_list("pk", "call_id")
    )
    cross = sum(
        1
        for pk, via in tally.decided.items()
        if tally.via.get(str(call_of.get(int(pk), "")), via) != via
    )
    total = sum(tally.requests.values())
    failed = len(tally.failures)
    statuses = dict(Counter(calls.values_list("status", flat=True)))
    size_text = f"{AGENTS} agents + {REVIEWERS} reviewers, {SECONDS} s"

    figures.record(
        "D3",
        f"failed requests / requests ({size_text})",
        f"{failed}/{total}",
        "< 0.1%",
        failed <= total * 0.001,
        requests=dict(tally.requests),
        failures=tally.failures[:5],
        statuses=statuses,
    )
    figures.record(
        "D3",
        "p95 submit (s)",
        round(p95(tally.submit), 3),
        f"< {P95_SUBMIT} (calibrated)",
        p95(tally.submit) < P95_SUBMIT,
        submits=len(tally.submit),
    )
    figures.record(
        "D3",
        "p95 approve (s)",
        round(p95(tally.approve), 3),
        f"< {P95_APPROVE} (calibrated)",
        p95(tally.approve) < P95_APPROVE,
        approvals=len(tally.approve),
        conflicts=tally.conflicts,
    )
    figures.record(
        "D3",
        "approvals of asks submitted through the other daphne / approvals",
        f"{cross}/{len(tally.decided)}",
        "> 0",
        cross > 0,
    )
    figures.record(
        "D3",
        "session chains verified",
        f"{len(sessions) - len(bad_chains)}/{len(sessions)}",
        "all",
        not bad_chains,
    )
    figures.record(
        "D3",
        f"stuck (queued or running {SETTLE} s after) / run twice",
        f"{len(stuck)} / {len(twice)}",
        "0 / 0",
        not stuck and not twice,
    )
    assert len(sessions) == AGENTS
    assert failed <= total * 0.001, tally.failures[:5]
    assert cross > 0, (len(tally.decided), "no ask was approved through the other daphne")
    assert not bad_chains and not stuck and not twice, (bad_chains, stuck[:5], twice)
    assert tally.approve and tally.submit


def _stuck(ids: list[str]) -> list[str]:
    open_ = ToolCall.objects.filter(pk__in=ids).exclude(status__in=TERMINAL_STATUSES)
    return [
        str(i) for i in open_.exclude(status=Status.PENDING_APPROVAL).values_list("pk", flat=True)
    ]
