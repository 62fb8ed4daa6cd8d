"""tests/support/processes: a CLI run by the tests leaves nothing running, not even a
`timeout` that moved itself into a process group of its own."""

from __future__ import annotations

import time

import pytest

from tests.support import processes

# No database, no Redis: the same on both backends (tests/conftest.py).
pytestmark = pytest.mark.backend_independent


def gone(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while processes.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not processes.alive(pid)


def test_what_a_run_left_in_the_background_is_killed() -> None:
    done = processes.run(
        ["bash", "-c", "timeout -k 2 90 bash -c 'sleep 60' >/dev/null 2>&1 & echo $!"], timeout=30
    )
    assert gone(int(done.stdout.split()[-1]))


def test_what_a_run_left_in_a_session_of_its_own_is_killed() -> None:
    """Codex's exec_command left `timeout -k 2 90 bash -c ...` running after a live test
    although the CLI's session was killed: a command in a new session is found by the
    environment marker it inherited."""
    done = processes.run(
        ["bash", "-c", "setsid timeout -k 2 90 bash -c 'sleep 60' >/dev/null 2>&1 & echo $!"],
        timeout=30,
    )
    assert gone(int(done.stdout.split()[-1]))
