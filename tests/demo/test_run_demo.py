"""`manage.py run_demo` on the embedded default: every scenario, then nothing left running."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import processes
from tests.support.live import free_port
from tests.support.paths import ROOT

# Its own environment (the embedded default in a fresh data directory), whichever backend
# the suite runs on: the same on both (tests/conftest.py).
pytestmark = [pytest.mark.live, pytest.mark.backend_independent]


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Short, so that the embedded Redis's Unix socket path stays under the 107-byte limit.
    path = Path(tempfile.mkdtemp(prefix="harness-demo-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def processes_of(data_dir: Path) -> list[str]:
    """Live processes whose environment points at this data directory (ours share it)."""
    return [
        f"{pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()!r}"
        for pid in processes.holding(f"HARNESS_DATA_DIR={data_dir}")
        if Path(f"/proc/{pid}").exists()
    ]


def demo_env(data_dir: Path) -> dict[str, str]:
    """The embedded default: no DATABASE_URL, no REDIS_URL, a fresh data directory."""
    drop = {
        "DATABASE_URL",
        "REDIS_URL",
        "HARNESS_SQLITE_PATH",
        "HARNESS_WORKSPACE_ROOT",
        "HARNESS_CELERY_QUEUE",
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST") and k not in drop}
    env.update(DJANGO_SETTINGS_MODULE="harness_site.settings", HARNESS_DATA_DIR=str(data_dir))
    return env


@pytest.mark.timeout(300)
def test_run_demo_shows_every_outcome_and_leaves_nothing_running(data_dir: Path) -> None:
    env = demo_env(data_dir)
    port = free_port()
    proc = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "run_demo",
            "--no-wait",
            "--auto-approve",
            "--port",
            str(port),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out

    # The embedded default: SQLite and a Redis that run_demo's own settings started.
    assert (data_dir / "harness.sqlite3").exists()
    assert re.search(r"Embedded Redis: unix://\S+ \(pid \d+, started by run_demo\)", out), out
    assert "sign in as reviewer / reviewer" in out
    assert f"http://127.0.0.1:{port}/approvals/" in out

    # Each scenario's outcome, as printed for the model.
    expected = [
        r"list_directory\(.*\n.*status=completed decision=allow decided_by=mode:standard",
        r"does not exist\. Use list_directory",  # read before the write: a useful error
        r"write_file\(.*\n.*auto-approved write_file.*\n.*status=completed decision=allow "
        r"decided_by=user:reviewer",
        r"\| Written by the Harness demo agent\.",  # the approved write's content, read back
        r"write_file\(\{\"path\": \"release-plan.md\".*\n.*auto-approve refused: This call must "
        r"be signed with your passkey.*\n.*denied write_file.*\n.*status=denied decision=deny "
        r"decided_by=user:reviewer",
        # A command previewed: the reviewer sees its effect; approving applies it.
        r"run_command\(.*\n.*the reviewer sees, above the command: This command would: "
        r"change 1 file\)\n.*auto-approved run_command.*\n.*status=completed",
        r"delete_file\(.*\n.*status=denied decision=deny decided_by=mode:standard",
        r"Tool 'readFile' does not exist\..*Did you mean 'read_file'\?",
        r"\$\.path: expected string",
        r"status=denied decision=deny decided_by=guard:workspace_confinement",
        r"'sudo' is blocked by the command guard",
        r"Upstream MCP server 'demo' registered: demo__word_count, demo__shout\.",
        r"demo__word_count\(.*\n.*isError=False\n.*\n.*\| 7 words, 2 lines, 49 characters",
        r"Demo finished: 12/12 scenarios ended as expected\.",
    ]
    for pattern in expected:
        assert re.search(pattern, out), f"missing {pattern!r} in:\n{out}"
    for dialect in ("openai", "anthropic", "native"):
        assert f"({dialect} dialect)" in out

    # How to connect a local Claude Code to the demo: settings written, one command shown.
    assert "Connect a local Claude Code to this demo" in out
    settings_file = data_dir / "claude-code-demo-settings.json"
    assert f"cp {settings_file} .claude/settings.local.json && HARNESS_TOKEN=hrn_" in out
    hook = json.loads(settings_file.read_text())["hooks"]["PreToolUse"][0]["hooks"][0]
    assert "dispatcher/gateways/hook_command.py" in hook["command"] and hook["type"] == "command"

    # Nothing it started is left running: the printed pids, the Redis, any pool child.
    pids = {int(p) for p in re.findall(r"\(pid (\d+)", out)}
    assert len(pids) == 4, out  # redis, daphne, the two lanes' workers
    assert [p for p in pids if processes.alive(p)] == []
    assert "Stopped the embedded Redis." in out
    assert not (data_dir / "redis.sock").exists()
    assert processes_of(data_dir) == []


@pytest.mark.timeout(300)
def test_ctrl_c_while_waiting_for_a_reviewer_stops_everything(data_dir: Path) -> None:
    log = data_dir.parent / (data_dir.name + ".out")
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "run_demo", "--port", str(free_port())],
            cwd=ROOT,
            env=demo_env(data_dir),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 180
        while "Waiting for a reviewer: open http://127.0.0.1:" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        text = log.read_text()
        log.unlink()
    assert "SIGINT: stopping." in text
    assert "/approvals/ and approve write_file" in text
    pids = {int(p) for p in re.findall(r"\(pid (\d+)", text)}
    assert len(pids) == 4, text  # redis, daphne, the two lanes' workers
    assert [p for p in pids if processes.alive(p)] == []
    assert "Stopped the embedded Redis." in text
    assert processes_of(data_dir) == []
