"""Red team: the lock that serializes the calls of a workspace nested in another agent's.
Agent A's program swaps a directory on the path of agent B's workspace (A/x/B) for a
symlink to another directory (here a person's tree, as well another agent's workspace),
over and over: B's lock is B's directory's own or refused, never the other directory's
(whose holder B's call would then block, while B's own calls ran side by side)."""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest

from dispatcher.tools import sandbox, workspace_lock
from tests.redteam.test_merged_fixes_review import nested_beside_a_victim
from tests.redteam.test_preview_lower_layer import FLIPPER
from tests.tools.test_preview import workspace

__all__ = ["workspace"]

ROUNDS = 20_000


def test_a_flipped_nested_workspace_never_takes_another_directorys_lock(
    workspace: Path,
) -> None:
    """Before the fix the lock was named by the workspace's resolved path: about one
    name in ten was the other directory's, and some reads raised EINVAL (a readlink of
    what had just stopped being a link)."""
    if sandbox._owner() is None:
        pytest.skip("needs Harness as root (the sandbox user)")
    a, victim = nested_beside_a_victim(workspace)
    nested = a / "x" / "B"
    own, others = workspace_lock.lock_path(nested), workspace_lock.lock_path(victim / "B")
    assert own != others
    flipper = subprocess.Popen(
        ["/usr/bin/python3", "-c", FLIPPER, str(a / "x"), str(a / "x-link")],
        stdout=subprocess.PIPE,
    )
    assert flipper.stdout is not None
    seen: dict[str, int] = {}
    try:
        assert flipper.stdout.readline() == b"flipping\n"
        for _ in range(ROUNDS):
            try:
                name = str(workspace_lock.lock_path(nested))
            except OSError as error:
                assert error.errno == errno.ELOOP, error  # refused: a symlink stands there
                name = "refused"
            seen[name] = seen.get(name, 0) + 1
    finally:
        flipper.kill()
        flipper.wait()
    assert str(others) not in seen, seen
    assert seen.get(str(own), 0) >= 100 and seen.get("refused", 0) >= 100, seen
