"""C1/C2: kill -9 of a worker's main process (with its pool), or of one pool child, at
random points of a stream of calls; C3: SIGTERM while long and short calls run. Against a
daphne, two Celery workers and a beat (reconciler every second) this test starts."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from dispatcher.models import Status, ToolCall
from tests.battery import figures
from tests.battery.conftest import seed_for, size
from tests.battery.live import native, start_session, started_counts, status_counts, wait_terminal
from tests.battery.procs import Stack
from tests.battery.tools import EXTRA_TOOLS
from tests.support.factories import make_agent

CALLS = size(40, 200)
KILLS = size(3, 12)
SESSIONS = 8
# After the last kill: the lease (2 s tool timeout + 1 s grace) + the requeue delay (3 s) +
# reconciler periods, with room for a busy two-core machine.
SETTLE = 90


def _marker_lines(workspaces: dict[str, Path], call: ToolCall) -> int:
    path = workspaces[str(call.session_id)] / "markers" / f"{call.tool_use_id}.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.timeout(900)
@pytest.mark.parametrize("target", ["main", "child"], ids=["C1-main-process", "C2-pool-child"])
def test_c1_c2_kill_9_loses_nothing_and_reruns_nothing_silently(stack: Stack, target: str) -> None:
    row = "C1" if target == "main" else "C2"
    rng = random.Random(seed_for(row))
    stack.env["HARNESS_EXTRA_TOOLS"] = EXTRA_TOOLS
    url = stack.daphne()
    workers = [stack.worker(2), stack.worker(2)]
    stack.beat()
    fx = make_agent(mode="trusted")
    ids: list[str] = []
    workspaces: dict[str, Path] = {}
    errors: list[str] = []
    with stack.agent_client(url, fx.headers) as client:
        sessions = [start_session(client) for _ in range(SESSIONS)]
        for s in sessions:
            workspaces[s["id"]] = Path(s["workspace"])

        def submit_all() -> None:
            for i in range(CALLS):
                name = "battery_keyed_write" if i % 2 == 0 else "battery_marker"
                args = {
                    "path": f"{'keys' if i % 2 == 0 else 'markers'}/c{i}.txt",
                    "delay": rng.uniform(0, 0.4),
                }
                response = client.post(
                    f"/api/v1/sessions/{sessions[i % SESSIONS]['id']}/calls",
                    json=native(f"c{i}", name, args),
                )
                if response.status_code not in (200, 202):
                    errors.append(f"{response.status_code} {response.text[:200]}")
                    continue
                ids.append(response.json()["calls"][0]["id"])
                time.sleep(rng.uniform(0, 0.05))

        submitter = threading.Thread(target=submit_all)
        submitter.start()
        kills = 0
        while kills < KILLS:
            time.sleep(rng.uniform(0.3, 1.5))
            index = rng.randrange(len(workers))
            victim = workers[index]
            if target == "main":
                victim.kill9()
                workers[index] = stack.worker(2)
            else:
                children = victim.children()
                if not children:
                    continue
                os.kill(rng.choice(children), signal.SIGKILL)
            kills += 1
        submitter.join(300)
    left = wait_terminal(ids, SETTLE)
    calls = {str(c.pk): c for c in ToolCall.objects.filter(pk__in=ids)}
    starts = started_counts(ids)
    reruns = [cid for cid, n in starts.items() if n > 1]
    marker_reruns = [
        cid
        for cid, c in calls.items()
        if c.name == "battery_marker" and _marker_lines(workspaces, c) > 1
    ]
    # A completed call must have had its effect exactly once; an outcome_unknown one may or may not.
    completed_without_effect = [
        cid
        for cid, c in calls.items()
        if c.name == "battery_marker"
        and c.status == Status.COMPLETED
        and _marker_lines(workspaces, c) != 1
    ]
    statuses = status_counts(ids)
    figures.record(
        row,
        f"calls submitted ({kills} kills of the {target} process)",
        len(ids),
        f"= {CALLS}",
        len(ids) == CALLS,
        errors=errors[:5],
    )
    figures.record(
        row,
        f"lost (not terminal {SETTLE} s after the last kill)",
        len(left),
        "0",
        not left,
        statuses=statuses,
    )
    figures.record(
        row,
        "silent re-runs (two starts, or two marker lines)",
        len(set(reruns) | set(marker_reruns)),
        "0",
        not reruns and not marker_reruns,
    )
    figures.record(
        row,
        "completed but effect count != 1",
        len(completed_without_effect),
        "0",
        not completed_without_effect,
    )
    figures.record(
        row,
        "outcome_unknown (shown to reviewers)",
        statuses.get("outcome_unknown", 0),
        "counted",
        True,
    )
    assert len(ids) == CALLS, errors[:5]
    assert not left, [(c.tool_use_id, c.status) for c in left[:10]]
    assert not reruns and not marker_reruns
    assert not completed_without_effect


@pytest.mark.timeout(600)
def test_c3_sigterm_drain_reexecutes_no_finished_call(stack: Stack) -> None:
    url = stack.daphne()
    worker = stack.worker(4)
    stack.beat()
    fx = make_agent(mode="trusted")
    ids: list[str] = []
    with stack.agent_client(url, fx.headers) as client:
        session = start_session(client)
        for i in range(2):
            body = {
                "calls": [
                    {
                        "id": f"long{i}",
                        "name": "sleep",
                        "arguments": {"seconds": 2.5, "tag": f"long{i}"},
                    }
                ]
            }
            ids.append(
                client.post(f"/api/v1/sessions/{session['id']}/calls", json=body).json()["calls"][
                    0
                ]["id"]
            )
        for i in range(size(8, 30)):
            body = {
                "calls": [
                    {
                        "id": f"short{i}",
                        "name": "sleep",
                        "arguments": {"seconds": 0.2, "tag": f"short{i}"},
                    }
                ]
            }
            ids.append(
                client.post(f"/api/v1/sessions/{session['id']}/calls", json=body).json()["calls"][
                    0
                ]["id"]
            )
    deadline = time.monotonic() + 20
    while ToolCall.objects.filter(pk__in=ids[:2], status=Status.RUNNING).count() < 2:
        assert time.monotonic() < deadline, "the long calls never started"
        time.sleep(0.05)
    finished_before = set(
        map(
            str,
            ToolCall.objects.filter(pk__in=ids, status=Status.COMPLETED).values_list(
                "pk", flat=True
            ),
        )
    )
    os.kill(worker.pid, signal.SIGTERM)  # the main process only: a warm shutdown
    try:
        worker.popen.wait(20)
        drained = True
    except Exception:
        drained = False
        worker.kill9()
    finished_during_drain = (
        set(
            map(
                str,
                ToolCall.objects.filter(pk__in=ids, status=Status.COMPLETED).values_list(
                    "pk", flat=True
                ),
            )
        )
        - finished_before
    )
    stack.worker(4)
    left = wait_terminal(ids, 60)
    starts = started_counts(ids)
    reexecuted = [cid for cid in finished_before | finished_during_drain if starts[cid] > 1]
    any_rerun = [cid for cid, n in starts.items() if n > 1]
    figures.record(
        "C3",
        "re-executions of calls finished before or during the drain",
        len(reexecuted),
        "0",
        not reexecuted,
        drained=drained,
        finished_during_drain=len(finished_during_drain),
    )
    figures.record("C3", "calls run twice in all", len(any_rerun), "0", not any_rerun)
    figures.record(
        "C3", "left unfinished after restart", len(left), "0", not left, statuses=status_counts(ids)
    )
    assert not reexecuted and not any_rerun and not left
