"""The sandbox and the freeze inputs through a real daphne and Celery worker."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import current_app
from django.conf import settings

from dispatcher import agents, batches, execution
from dispatcher.models import Status, ToolCall
from tests.support.factories import make_agent, submit_one, unique
from tests.support.live import LiveStack, start_worker, stop
from tests.tools import support
from tests.tools.support import PROBE_SCRIPT, probe_results, require_bwrap

pytestmark = pytest.mark.live


@pytest.fixture
def live_sandbox(live_stack: LiveStack, live_db: None) -> LiveStack:
    require_bwrap()
    if live_stack.env.get("HARNESS_SANDBOX", "bwrap") != "bwrap":
        pytest.skip("The live stack runs with HARNESS_SANDBOX=off; unset it to run these.")
    return live_stack


def start(client: httpx.Client) -> dict[str, Any]:
    response = client.post("/api/v1/sessions", json={"title": "sandbox"})
    assert response.status_code == 201, response.text
    return response.json()


def submit(
    client: httpx.Client, session: dict[str, Any], calls: list[dict[str, Any]], wait: float = 20
) -> list[dict[str, Any]]:
    response = client.post(
        f"/api/v1/sessions/{session['id']}/calls", params={"wait": wait}, json={"calls": calls}
    )
    assert response.status_code in (200, 202), response.text
    result: list[dict[str, Any]] = response.json()["calls"]
    return result


def test_a_command_on_the_worker_reaches_none_of_harness_state(live_sandbox: LiveStack) -> None:
    fx = make_agent(mode="trusted")
    env = live_sandbox.env
    targets: dict[str, Any] = {"read": {}, "unix": {}, "tcp": {"redis": 6379}}
    if "HARNESS_SQLITE_PATH" in env:
        database = Path(env["HARNESS_SQLITE_PATH"])
        assert database.read_bytes().startswith(b"SQLite format 3")
        targets["read"]["database"] = str(database)
        socket_path = Path(env["HARNESS_DATA_DIR"]) / "redis.sock"
        assert socket_path.is_socket()
        targets["unix"]["redis"] = str(socket_path)
    else:
        targets["tcp"]["database"] = 5432
    with live_sandbox.client(fx) as client:
        mine, theirs = start(client), start(client)
        secret = Path(theirs["workspace"]) / "secret.txt"
        secret.write_text("their secret\n")
        targets["read"]["other workspace"] = str(secret)
        targets["write"] = {"workspace root": str(Path(mine["workspace"]).parent / "x")}
        Path(mine["workspace"], "probe.py").write_text(PROBE_SCRIPT)
        argv = ["python3", "probe.py", json.dumps(targets)]
        [call] = submit(
            client, mine, [{"id": "p", "name": "run_command", "arguments": {"argv": argv}}]
        )
    assert call["status"] == "completed", call
    found = probe_results(call["content"])
    assert found.pop("uid") == support.sandbox_uid()
    if Path(mine["workspace"]).is_relative_to(tempfile.gettempdir()):
        found.pop("write workspace root")  # lands in the private /tmp (checked below)
    assert found and all(value.startswith("blocked") for value in found.values()), found
    assert not (Path(mine["workspace"]).parent / "x").exists()


def test_freeze_inputs_leave_the_server_answering(live_sandbox: LiveStack) -> None:
    fx = make_agent(mode="trusted")
    with live_sandbox.client(fx) as client:
        session = start(client)
        Path(session["workspace"], "long.txt").write_text("a" * 200_000 + "\n")
        calls = [
            {"id": "s", "name": "search_files", "arguments": {"pattern": "(.+)+\\x01"}},
            {"id": "y", "name": "run_command", "arguments": {"argv": ["yes"]}},
        ]

        def slowest_of_five() -> float:
            slowest = 0.0
            for _ in range(5):
                started = time.monotonic()
                assert client.get("/api/v1/tools").status_code == 200
                assert client.get(f"/api/v1/sessions/{session['id']}").status_code == 200
                slowest = max(slowest, time.monotonic() - started)
            return slowest

        # The same requests before the calls: what the host's load alone costs them (a
        # frozen server would hold them for the search's run, up to its 30 s timeout).
        quiet = slowest_of_five()
        submitted = submit(client, session, calls, wait=0)
        slowest = slowest_of_five()
        assert slowest < 1.0 + 2 * quiet, f"the server took {slowest:.2f} s ({quiet:.2f} s before)"
        deadline = time.monotonic() + 20
        while True:
            done = client.get(f"/api/v1/sessions/{session['id']}").json()["calls"]
            if all(c["status"] == "completed" for c in done) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        by_id = {c["tool_use_id"]: c for c in done}
        assert by_id["s"]["status"] == "completed", by_id["s"]
        assert by_id["s"]["content"].startswith("No matches for")
        assert by_id["y"]["status"] == "completed", by_id["y"]
        assert "[stopped: the command wrote more than" in by_id["y"]["content"]
        [echo] = submit(
            client,
            session,
            [{"id": "e", "name": "run_command", "arguments": {"argv": ["echo", "hi"]}}],
        )
    assert {c["id"] for c in submitted} == {by_id["s"]["id"], by_id["y"]["id"]}
    assert echo["status"] == "completed" and echo["content"] == "exit code 0\nhi\n"


def test_a_worker_child_past_the_task_time_limit_is_killed_and_its_call_never_re_runs(
    live_stack: LiveStack, live_db: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The backstop: a tool that holds the GIL cannot be stopped by its own timeout; the
    pool kills the child at CELERY_TASK_TIME_LIMIT and the reconciler ends the call."""
    hog = "tests.tools.support.GIL_HOG"
    queue = unique("harness-time-limit")
    env = {
        **live_stack.env,
        "HARNESS_CELERY_QUEUE": queue,
        "HARNESS_TASK_TIME_LIMIT": "3",
        "HARNESS_EXTRA_TOOLS": hog,
    }
    monkeypatch.setattr(settings, "HARNESS_TOOLS", [*settings.HARNESS_TOOLS, hog])
    # time_limit=None: the message carries no limit of this process's own, so the worker's
    # HARNESS_TASK_TIME_LIMIT applies (a sender that has the task registered sends its own
    # setting, the same value in a deployment: see the test below).
    monkeypatch.setattr(
        batches,
        "enqueue",
        lambda call_id, *turn, **resend: current_app.send_task(
            batches.EXECUTE_TASK, args=(call_id,), queue=queue, time_limit=None
        ),
    )
    worker = start_worker(env, tmp_path, concurrency=1, queues=queue)
    try:
        fx = make_agent(mode="trusted")
        session = agents.start_session(agent=fx.agent, title="hog")
        workspace = Path(session.workspace)
        call = submit_one(session, "gil_hog", {})
        deadline = time.monotonic() + 40
        log = ""
        while "Hard time limit (3" not in log and time.monotonic() < deadline:
            time.sleep(0.2)
            log = "".join(p.read_text() for p in tmp_path.glob("worker-*.log"))
        assert "Hard time limit (3" in log, log[-3000:]
        assert ToolCall.objects.get(pk=call.pk).status == Status.RUNNING
        # The lease (the tool's 1 s timeout plus the tests' 1 s grace) ends by the clock of
        # a loaded host: the reconciler is asked until it ends the call (it ended none, once,
        # asked 1.5 s after the kill on CI's load).
        ended, deadline = 0, time.monotonic() + 30
        while ToolCall.objects.get(pk=call.pk).status == Status.RUNNING:
            assert time.monotonic() < deadline, "the reconciler never ended the killed call"
            ended += execution.reconcile()["outcome_unknown"]
            time.sleep(0.2)
        assert ended >= 1
        assert ToolCall.objects.get(pk=call.pk).status == Status.OUTCOME_UNKNOWN
        time.sleep(2)
        assert len((workspace / "hog-runs.txt").read_text().splitlines()) == 1
    finally:
        stop(worker)


def test_the_task_time_limit_comes_from_the_settings() -> None:
    from dispatcher.tasks import execute_call

    assert settings.CELERY_TASK_TIME_LIMIT == settings.HARNESS_TASK_TIME_LIMIT
    assert execute_call.time_limit == settings.HARNESS_TASK_TIME_LIMIT
    assert execute_call.soft_time_limit is None
