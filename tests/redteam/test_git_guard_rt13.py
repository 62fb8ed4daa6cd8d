"""Red team (rt13) of the git metadata guard's reads after a run (dispatcher/tools/
sandbox_git.py): what a command no person approved leaves for the worker to read. Real
bwrap, real git."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from dispatcher.tools import sandbox
from tests.redteam.test_git_metadata_guard import agent_in_sandbox, host_git, repository
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


def released_after(path: Path, seconds: float) -> threading.Event:
    """Open the FIFO at `path` for writing after `seconds` (a reader blocked on it goes
    on), unless the returned event is set first: the test ends either way."""
    done = threading.Event()

    def release() -> None:
        if done.wait(seconds):
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return
        os.close(fd)

    threading.Thread(target=release, daemon=True).start()
    return done


@pytest.mark.parametrize("name", ["index", "sharedindex." + "ab" * 20])
def test_a_fifo_index_does_not_hold_the_worker(agent_in_sandbox: AgentFixture, name: str) -> None:
    """`.git/index` is writable for an unapproved command (git add), and the guard reads
    an index the run changed: opened without O_NONBLOCK, a FIFO there (or a split
    index's shared part beside it) held the worker forever, in the workspace's lock,
    with nothing left in the sandbox to write it."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    host_git(workspace, "commit", "--allow-empty", "-qm", "base")
    sandbox.give_to_sandbox(workspace)
    planted = workspace / ".git" / name
    done = released_after(planted, 15)
    started = time.monotonic()
    script = f"rm -f .git/{name} && mkfifo .git/{name} && echo done"
    output = sandboxed(workspace, script)
    took = time.monotonic() - started
    done.set()
    assert took < 10, (took, output)
    assert output.startswith("exit code 0\ndone"), output
    assert "it was removed" in output, output
    assert not (workspace / ".git" / "index").is_fifo()
    # and the person's git goes on (an index git makes again names no planted part)
    host_git(workspace, "reset", "-q")
    assert "base" in host_git(workspace, "log", "--format=%s")
    host_git(workspace, "status")
