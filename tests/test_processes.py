"""tests/support/processes: a CLI run by the tests leaves nothing running, not even a
`timeout` that moved itself into a process group of its own."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support import processes

# No database, no Redis: the same on both backends (tests/conftest.py).
pytestmark = pytest.mark.backend_independent


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_what_a_run_left_in_the_background_is_killed() -> None:
    done = processes.run(
        ["bash", "-c", "timeout -k 2 90 bash -c 'sleep 60' >/dev/null 2>&1 & echo $!"], timeout=30
    )
    left = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 5
    while alive(left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(left)
