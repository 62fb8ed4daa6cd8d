"""Execution against a real daphne, a real Celery worker, PostgreSQL/SQLite and Redis."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from django.db import connection

from audit.models import AuditEvent
from dispatcher import execution, transitions
from dispatcher.models import Status, ToolCall
from tests.support.factories import AgentFixture, make_agent
from tests.support.live import LiveStack

pytestmark = pytest.mark.live


def start(client: httpx.Client) -> dict[str, Any]:
    response = client.post("/api/v1/sessions", json={"title": "live"})
    assert response.status_code == 201, response.text
    return response.json()


def submit(
    client: httpx.Client, session: dict[str, Any], calls: list[dict[str, Any]], wait: float = 20
) -> httpx.Response:
    return client.post(
        f"/api/v1/sessions/{session['id']}/calls", params={"wait": wait}, json={"calls": calls}
    )


def wait_for_status(call_id: str, status: str, seconds: float = 15) -> ToolCall:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        call = ToolCall.objects.get(pk=call_id)
        if call.status == status:
            return call
        time.sleep(0.05)
    raise AssertionError(
        f"call {call_id} stayed {ToolCall.objects.get(pk=call_id).status}, wanted {status}"
    )


def test_allowed_read_runs_on_the_worker_and_the_waiting_request_gets_the_result(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    with live_stack.client(live_agent) as client:
        session = start(client)
        Path(session["workspace"], "notes.txt").write_text("hello from the workspace\n")
        response = submit(
            client, session, [{"id": "r1", "name": "read_file", "arguments": {"path": "notes.txt"}}]
        )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["calls"][0]["status"] == "completed"
    assert "hello from the workspace" in body["results"][0]["content"]
    assert body["results"][0]["is_error"] is False
    kinds = list(
        AuditEvent.objects.filter(session_id=session["id"])
        .order_by("seq")
        .values_list("kind", flat=True)
    )
    assert kinds == [
        "session.started",
        "call.received",
        "call.allowed",
        "call.started",
        "call.completed",
    ]


def test_approval_wakes_the_waiting_request_with_the_tools_result(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    with live_stack.client(live_agent) as client:
        session = start(client)
        responses: list[httpx.Response] = []
        call = {
            "id": "w1",
            "name": "write_file",
            "arguments": {"path": "out/hello.txt", "content": "approved!"},
        }
        waiter = threading.Thread(
            target=lambda: responses.append(submit(client, session, [call], wait=30))
        )
        waiter.start()
        pending = ToolCall.objects.filter(session_id=session["id"], tool_use_id="w1")
        deadline = time.monotonic() + 10
        while not pending.filter(status=Status.PENDING_APPROVAL).exists():
            assert time.monotonic() < deadline, "the call never reached pending_approval"
            time.sleep(0.05)
        decided_at = time.monotonic()
        assert transitions.approve_call(call_id=pending.get().pk, actor="user:rita")
        waiter.join(30)
        latency = time.monotonic() - decided_at
    body = responses[0].json()
    assert responses[0].status_code == 200
    assert body["calls"][0]["status"] == "completed"
    assert body["results"][0]["content"].startswith("Wrote")
    assert Path(session["workspace"], "out/hello.txt").read_text() == "approved!"
    # (woken by the approval, not at the end of its 30 s wait; 15 s, not 5: on a loaded host
    # the worker's run of the write and the answer's trip are seconds of the wall clock)
    assert latency < 15, f"approval took {latency:.2f}s to reach the agent"


def test_concurrency_safe_calls_run_in_parallel_and_results_keep_request_order(
    live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="trusted")
    with live_stack.client(fx) as client:
        session = start(client)
        calls = [
            {"id": f"s{i}", "name": "sleep", "arguments": {"seconds": 2, "tag": f"s{i}"}}
            for i in range(3)
        ]
        response = submit(client, session, calls, wait=30)
    assert response.status_code == 200, response.text
    assert [r["id"] for r in response.json()["results"]] == ["s0", "s1", "s2"]
    log = [
        json.loads(line)
        for line in Path(session["workspace"], "sleep-log.jsonl").read_text().splitlines()
    ]
    assert len(log) == 3
    # Parallel, told by the sleeps' own times (each began before any ended), not by the
    # request's time (under 3 s once, which a loaded host's worker can outlast)
    assert max(e["start"] for e in log) < min(e["end"] for e in log), (
        "the safe calls did not overlap"
    )


def test_unsafe_calls_run_alone_in_request_order(live_stack: LiveStack, live_db: None) -> None:
    fx = make_agent(mode="trusted")
    with live_stack.client(fx) as client:
        session = start(client)
        calls = [
            {
                "id": "a",
                "name": "slow_append",
                "arguments": {"path": "order.txt", "line": "first", "delay": 0.4},
            },
            {
                "id": "b",
                "name": "slow_append",
                "arguments": {"path": "order.txt", "line": "second", "delay": 0},
            },
            {"id": "c", "name": "sleep", "arguments": {"seconds": 0.1, "tag": "c"}},
            {
                "id": "d",
                "name": "slow_append",
                "arguments": {"path": "order.txt", "line": "third", "delay": 0},
            },
        ]
        response = submit(client, session, calls, wait=30)
    assert response.status_code == 200, response.text
    assert Path(session["workspace"], "order.txt").read_text().splitlines() == [
        "first",
        "second",
        "third",
    ]
    started = [
        c.started_at
        for c in ToolCall.objects.filter(session_id=session["id"]).order_by("batch_index")
    ]
    assert started == sorted(started)


def test_a_tool_past_its_timeout_ends_timed_out_with_a_usable_message(
    live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="trusted")
    with live_stack.client(fx) as client:
        session = start(client)
        response = submit(
            client, session, [{"id": "t", "name": "sleep", "arguments": {"seconds": 8}}], wait=30
        )
    call = response.json()["calls"][0]
    assert call["status"] == "timed_out"
    assert "did not finish within its 3 s limit" in call["content"]
    assert call["is_error"] is True


def test_a_command_past_its_timeout_is_killed(
    live_stack: LiveStack, live_db: None, settings: Any
) -> None:
    fx = make_agent(mode="trusted")
    with live_stack.client(fx) as client:
        session = start(client)
        argv = ["python3", "-c", "import time; time.sleep(0.2); print('ok')"]
        response = submit(
            client, session, [{"id": "c", "name": "run_command", "arguments": {"argv": argv}}]
        )
    call = response.json()["calls"][0]
    assert (
        call["status"] == "completed"
        and "exit code 0" in call["content"]
        and "ok" in call["content"]
    )


def test_second_delivery_of_the_same_message_does_nothing(
    live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="trusted")
    with live_stack.client(fx) as client:
        session = start(client)
        call = {
            "id": "once",
            "name": "slow_append",
            "arguments": {"path": "once.txt", "line": "x", "delay": 0},
        }
        call_id = submit(client, session, [call]).json()["calls"][0]["id"]

    def run() -> None:
        try:
            execution.execute_call(call_id)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    from dispatcher.tasks import execute_call

    execute_call.delay(call_id)
    time.sleep(0.5)
    assert Path(session["workspace"], "once.txt").read_text() == "x\n"
    assert ToolCall.objects.get(pk=call_id).attempts == 1
    assert AuditEvent.objects.filter(subject=f"call:{call_id}", kind="call.started").count() == 1


def _kill_worker(proc: subprocess.Popen[bytes]) -> None:
    children = subprocess.run(
        ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
    ).stdout.split()
    for pid in [proc.pid, *map(int, children)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    proc.wait()


def test_worker_killed_mid_call_ends_outcome_unknown_and_never_reruns(
    live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="trusted")
    with live_stack.client(fx) as client:
        session = start(client)
        call = {
            "id": "k",
            "name": "slow_append",
            "arguments": {"path": "k.txt", "line": "side effect", "delay": 1.5},
        }
        call_id = submit(client, session, [call], wait=0).json()["calls"][0]["id"]
        running = wait_for_status(call_id, Status.RUNNING)
        _kill_worker(live_stack.worker)
        try:
            assert execution.reconcile()["outcome_unknown"] == 0  # the lease is still valid
            time.sleep(max(0.0, (running.lease_until.timestamp() - time.time())) + 0.2)
            assert execution.reconcile()["outcome_unknown"] >= 1
        finally:
            live_stack.restart_worker()
        result = client.get(f"/api/v1/calls/{call_id}", params={"wait": 5}).json()
    assert result["status"] == "outcome_unknown"
    assert "not known whether the call took effect" in result["content"]
    time.sleep(1)
    assert not Path(session["workspace"], "k.txt").exists()
    assert ToolCall.objects.get(pk=call_id).attempts == 1


def test_reconciler_resends_a_lost_message_carrying_only_the_call_id(
    live_stack: LiveStack, live_db: None, settings: Any
) -> None:
    fx = make_agent(mode="trusted")
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    broker = redis.Redis.from_url(settings.REDIS_URL)
    live_stack.worker.terminate()
    live_stack.worker.wait(15)
    try:
        with live_stack.client(fx) as client:
            session = start(client)
            call = {"id": "lost", "name": "list_directory", "arguments": {"path": "."}}
            call_id = submit(client, session, [call], wait=0).json()["calls"][0]["id"]
        messages = broker.lrange(queue, 0, -1)
        bodies = [json.loads(base64.b64decode(json.loads(m)["body"])) for m in messages]
        assert [call_id] in [b[0] for b in bodies], bodies  # args are exactly [call_id]
        assert all(b[1] == {} for b in bodies)
        broker.delete(queue)  # the message is lost
    finally:
        live_stack.restart_worker()
    time.sleep(0.5)
    assert ToolCall.objects.get(pk=call_id).status == Status.QUEUED
    settings.HARNESS_REQUEUE_AFTER = 0
    assert execution.reconcile()["resent"] == 1
    assert wait_for_status(call_id, Status.COMPLETED).is_error is False


def test_concurrent_submissions_of_one_message_create_one_call(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    with live_stack.client(live_agent) as client:
        session = start(client)
    body = {
        "calls": [
            {"id": "dup", "name": "write_file", "arguments": {"path": "d.txt", "content": "x"}}
        ]
    }
    responses: list[httpx.Response] = []

    def submit_once() -> None:
        with live_stack.client(live_agent) as own:
            responses.append(own.post(f"/api/v1/sessions/{session['id']}/calls", json=body))

    threads = [threading.Thread(target=submit_once) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in responses) == [202] * 6
    assert len({r.json()["calls"][0]["id"] for r in responses}) == 1
    assert ToolCall.objects.filter(session_id=session["id"], tool_use_id="dup").count() == 1
    received = AuditEvent.objects.filter(session_id=session["id"], kind="call.received")
    assert received.count() == 1


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="counts PostgreSQL sessions (pg_stat_database)"
)
def test_the_worker_keeps_its_database_connections_across_calls(
    live_stack: LiveStack, live_db: None
) -> None:
    """Celery's Django fixup used to close each prefork child's whole connection pool before
    and after every task: three new PostgreSQL connections per call (celery#10554)."""

    def sessions_opened() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
            )
            return int(cursor.fetchone()[0])

    fixture = make_agent(mode="trusted")
    with live_stack.client(fixture) as client:
        session = start(client)
        submit(client, session, [{"id": "warm", "name": "list_directory", "arguments": {}}])
        time.sleep(1.5)  # stats of backends that came and went are flushed
        before = sessions_opened()
        calls = [{"id": f"c{i}", "name": "list_directory", "arguments": {}} for i in range(40)]
        for start_at in range(0, 40, 10):
            response = submit(client, session, calls[start_at : start_at + 10])
            assert response.status_code == 200, response.text
        time.sleep(1.5)
    opened = sessions_opened() - before
    # 40 calls on 4 worker processes, plus daphne's pool: a handful of connections, not 120.
    assert opened < 20, f"{opened} PostgreSQL sessions opened for 40 calls"
