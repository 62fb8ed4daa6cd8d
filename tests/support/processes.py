"""Run a coding agent's CLI so that nothing it started outlives the test.

A CLI runs its tools in children of its own (Claude Code's Bash, Codex's exec_command
wrapped in `timeout -k 2 90 bash -c ...`), and `timeout` moves itself into a process
group of its own, so killing the CLI or its group leaves them running. The CLI is started
as the leader of a new session instead, and when it is done every process still in that
session is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any


def _session_members(session: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:  # state, ppid, pgrp, session
            members.append(int(entry.name))
    return members


def kill_session(session: int) -> None:
    """SIGKILL every process left in `session` (a CLI's, started by `start`)."""
    for pid in _session_members(session):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def start(argv: list[str], **kwargs: Any) -> subprocess.Popen[str]:
    """Popen(argv) as the leader of a new session; end it with `finish`."""
    return subprocess.Popen(argv, start_new_session=True, text=True, **kwargs)


def finish(process: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """The process's output once it exits; then whatever it left in its session is killed."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        process.kill()
        kill_session(process.pid)
    return stdout, stderr


def run(argv: list[str], *, timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """subprocess.run(argv, capture_output=True, text=True) that leaves nothing running."""
    process = start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
    stdout, stderr = finish(process, timeout)
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)
