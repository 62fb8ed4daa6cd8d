"""Red team (rt2git) of what a command no person approved leaves in a guarded git
directory where git reads or writes by name: a FIFO. git opens `HEAD` to read it before
anything else (`validate_headref`), with no O_NONBLOCK: `rm .git/HEAD && mkfifo
.git/HEAD` had every `git status` of the person's (and the prompt of a shell that shows
the branch) hang until killed; a FIFO at `COMMIT_EDITMSG` hung their `git commit -m`, one
at `logs/HEAD` their `git checkout -b`. git makes none there. Real bwrap, real git."""

from __future__ import annotations

import subprocess

import pytest

from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_git_metadata_guard_rt12 import G
from tests.redteam.test_rtgit_git_links import _workspace, agent_in_sandbox
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


@pytest.mark.parametrize(
    ("fifo", "person"),
    [
        ("HEAD", ["status", "--short"]),
        ("COMMIT_EDITMSG", ["commit", "-q", "--allow-empty", "-m", "mine"]),
        ("logs/HEAD", ["checkout", "-qb", "x"]),
    ],
)
def test_a_fifo_left_in_git_hangs_no_persons_git(
    agent_in_sandbox: AgentFixture, fifo: str, person: list[str]
) -> None:
    workspace, _ = _workspace(agent_in_sandbox)
    output = sandboxed(workspace, f"rm -f .git/{fifo} && mkfifo .git/{fifo} && echo done")
    assert "done" in output, output
    try:
        subprocess.run(
            ["git", "-c", "safe.directory=*", *G, *person],
            cwd=workspace,
            capture_output=True,
            timeout=10,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the person's git {person[0]} hung on .git/{fifo}")
    assert not (workspace / ".git" / fifo).is_fifo()
    assert "FIFO" in output, output


def test_a_fifo_in_a_made_bare_repository_hangs_no_persons_git(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`git init --bare x` with its HEAD made a FIFO: the person's git in `x` (or below
    it) waits on it to tell whether `x` is a git directory."""
    workspace, _ = _workspace(agent_in_sandbox)
    script = "git init -q --bare x && rm x/HEAD && mkfifo x/HEAD && echo done"
    output = sandboxed(workspace, script)
    assert "done" in output, output
    try:
        subprocess.run(
            ["git", "-c", "safe.directory=*", "status", "--short"],
            cwd=workspace / "x",
            capture_output=True,
            timeout=10,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the person's git status in x hung on x/HEAD")
    assert not (workspace / "x" / "HEAD").is_fifo()
