"""rtq: the execution lane's turns (dispatcher.batches) against one agent whose queued
calls wait for each other's workspace lock. A worker that took a call of a session whose
workspace another call holds (a command runs: the lock is exclusive) waited for the
lock, holding its process: one agent's few slow commands in one session held every
worker, and another agent's single listing waited behind all of them, whatever its turn.
A real daphne and a real Celery worker (4 processes)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.factories import make_agent
from tests.support.live import LiveStack

SLOW = 6  # seconds each of the slow agent's commands runs
WORKERS = 4  # the live stack's worker processes


def start(client: httpx.Client) -> str:
    response = client.post("/api/v1/sessions", json={"title": "locked"})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@pytest.mark.live
def test_calls_waiting_for_their_workspace_do_not_hold_the_workers(
    live_stack: LiveStack, live_db: None
) -> None:
    slow, other = make_agent(mode="trusted"), make_agent(mode="standard")
    with live_stack.client(slow) as a, live_stack.client(other, timeout=60) as b:
        session, quiet = start(a), start(b)
        ids: list[str] = []
        for i in range(WORKERS + 1):  # one running, the others waiting for its lock
            response = a.post(
                f"/api/v1/sessions/{session}/calls",
                json={
                    "calls": [
                        {
                            "id": f"s{i}",
                            "name": "run_command",
                            "arguments": {"argv": ["sleep", str(SLOW)]},
                        }
                    ]
                },
            )
            assert response.status_code in (200, 202), response.text[:300]
            assert response.json()["calls"][0]["status"] == "queued", response.text[:300]
            ids.append(response.json()["calls"][0]["id"])
        time.sleep(1)  # the worker processes have taken the commands
        began = time.monotonic()
        response = b.post(
            f"/api/v1/sessions/{quiet}/calls",
            params={"wait": 50},
            json={"calls": [{"id": "l", "name": "list_directory", "arguments": {"path": "."}}]},
        )
        took = time.monotonic() - began
        assert response.status_code == 200, response.text
        assert response.json()["calls"][0]["status"] == "completed", response.text[:500]
        # Every command still runs, one at a time.
        for call_id in ids:
            answer = a.get(f"/api/v1/calls/{call_id}", params={"wait": 50}, timeout=60)
            assert answer.json()["status"] == "completed", answer.text[:300]
    assert took < SLOW / 2, took
