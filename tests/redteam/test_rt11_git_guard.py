"""rt11: the git-metadata guard's pointer settings (core.hooksPath, include.path) through
/proc or /dev.

3c9fba8 refused `core.fsmonitor = /proc/self/cwd/fsmon.sh` (a program outside the
workspace by its words; for the person's git, whose cwd is the work tree, the workspace's
`fsmon.sh`). The pointer settings kept the older test, `_inside` by words and by Harness's
own `realpath`: `core.hooksPath = /proc/self/cwd/githooks` passed (Harness's cwd is not
the workspace), nothing was bound, an allowed `cp` wrote `githooks/pre-commit`, and the
person's `git commit` on the host ran it. The same for `[include] path =
/proc/self/cwd/shared.gitconfig` (git resolves it where the person runs git).

Real sandbox (bwrap), real worker, real host git."""

from __future__ import annotations

import pytest

from dispatcher.tools import sandbox_git
from tests.redteam.test_git_metadata_guard import (
    agent_in_sandbox,
    allow,
    host_git,
    repository,
)
from tests.redteam.test_git_metadata_guard2 import plant_program
from tests.redteam.test_git_metadata_guard_usable import REFUSED, run
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


@pytest.mark.parametrize("value", ["/proc/self/cwd/githooks", "/dev/fd/../cwd/githooks"])
def test_a_hooks_path_under_proc_runs_no_unapproved_command(
    agent_in_sandbox: AgentFixture, value: str
) -> None:
    fx = agent_in_sandbox
    allow(fx, "mkdir *", "cp *")
    session_id, workspace = repository(fx)
    host_git(workspace, "config", "core.hooksPath", value)
    plant_program(workspace, "hook")
    output = run(fx, session_id, "mkdir", ["mkdir", "githooks"])
    assert REFUSED in output, output
    assert not (workspace / "githooks").exists()
    assert sandbox_git.unguardable(workspace) is not None
    # the premise: a hook there is what the person's commit runs
    (workspace / "githooks").mkdir()
    (workspace / "githooks" / "pre-commit").write_bytes((workspace / "evil.sh").read_bytes())
    (workspace / "githooks" / "pre-commit").chmod(0o755)
    (workspace / "a.txt").write_text("a\n")
    host_git(workspace, "add", "a.txt")
    host_git(workspace, "commit", "-q", "-m", "a")
    assert (workspace / "hook-ran").exists()


def test_an_include_under_proc_runs_no_unapproved_command(agent_in_sandbox: AgentFixture) -> None:
    fx = agent_in_sandbox
    allow(fx, "cp *")
    session_id, workspace = repository(fx)
    host_git(workspace, "config", "include.path", "/proc/self/cwd/shared.gitconfig")
    (workspace / "a").write_text("[core]\n\tfsmonitor = ./evil.sh\n")
    output = run(fx, session_id, "cp", ["cp", "a", "shared.gitconfig"])
    assert REFUSED in output, output
    assert sandbox_git.unguardable(workspace) is not None
