"""Run a coding agent's CLI so that nothing it started outlives the test.

A CLI runs its tools in children of its own (Claude Code's Bash, Codex's exec_command
wrapped in `timeout -k 2 90 bash -c ...`), and `timeout` moves itself into a process
group of its own, so killing the CLI or its group leaves them running; a tool command may
also start a session of its own (setsid). The CLI is started as the leader of a new
session, with a marker in its environment that its children inherit, and when it is done
every process still in that session or holding that marker is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
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


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def holding(marker: str) -> list[int]:
    """Live processes other than this one whose environment has the entry `marker`."""
    entry_bytes = marker.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry_bytes in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return [pid for pid in found if alive(pid)]


def kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def kill_session(session: int) -> None:
    """SIGKILL every process left in `session` (a CLI's, started by `start`)."""
    kill(_session_members(session))


MARKER = "HARNESS_TEST_RUN"
_markers: dict[int, str] = {}  # pid of a started CLI -> the marker its children inherit


def start(argv: list[str], **kwargs: Any) -> subprocess.Popen[str]:
    """Popen(argv) as the leader of a new session, its environment marked; end it with
    `finish`."""
    marker = f"{MARKER}={uuid.uuid4().hex}"
    env = dict(kwargs.pop("env", None) or os.environ)
    env[MARKER] = marker.split("=", 1)[1]
    process = subprocess.Popen(argv, start_new_session=True, text=True, env=env, **kwargs)
    _markers[process.pid] = marker
    return process


def _running(pids: list[int], name: str) -> list[int]:
    """Those of `pids` alive with `name` in their command line."""
    found = []
    for pid in pids:
        try:
            if name.encode() in Path(f"/proc/{pid}/cmdline").read_bytes() and alive(pid):
                found.append(pid)
        except OSError:
            continue
    return found


def finish(
    process: subprocess.Popen[str], timeout: float, let_finish: str = "", grace: float = 30
) -> tuple[str, str]:
    """The process's output once it exits; then, if `let_finish` names a program (a hook a
    CLI runs in the background, which may still be filing its report when the CLI exits),
    such processes it left are given up to `grace` seconds to end by themselves; then
    whatever it left in its session, or anywhere with its environment marker, is killed."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        if let_finish:
            marker = _markers.get(process.pid, f"{MARKER}=-")
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and _running(
                _session_members(process.pid) + holding(marker), let_finish
            ):
                time.sleep(0.05)
    finally:
        process.kill()
        kill_session(process.pid)
        kill(holding(_markers.pop(process.pid, f"{MARKER}=-")))
    return stdout, stderr


def run(argv: list[str], *, timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """subprocess.run(argv, capture_output=True, text=True) that leaves nothing running."""
    process = start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
    stdout, stderr = finish(process, timeout)
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)
