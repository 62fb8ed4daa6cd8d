"""Red team (rt2git) of the removal of a symbolic link a command no person approved left
in a guarded git directory (`_remove_hidden_repositories`), which takes a link for one
the run made by its ctime. A directory renamed moves what it holds with their ctime
untouched (ext4, Linux 6.18: `mv e f` leaves `f/old`'s ctime as it was), so a link made
in the work tree by one run (`stage/HEAD -> ~/.bashrc`) and moved into `.git` in its
directory by the next (`rm -r .git/logs && mv stage .git/logs`) would bear an old ctime.
This held: `.git` is a mount point in the sandbox, a rename into it fails (EXDEV) and
`mv` copies, making the link anew. Kept so that it keeps holding. Real bwrap, real git."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_git_metadata_guard_rt12 import G
from tests.redteam.test_rtgit_git_links import _workspace, agent_in_sandbox
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


@pytest.mark.parametrize(
    ("plant", "move", "person"),
    [
        (
            "mkdir stage && ln -s {home}/.bashrc stage/HEAD",
            "rm -r .git/logs && mv stage .git/logs",
            ["checkout", "-qb", "x"],
        ),
        (
            "mkdir -p stage/heads && ln -s {home} stage/tags",
            "cp -a .git/refs/heads/. stage/heads/ && rm -r .git/refs && mv stage .git/refs",
            ["tag", "v1"],
        ),
    ],
    ids=["logs-HEAD", "refs-tags"],
)
def test_an_old_link_moved_into_git_in_its_directory_is_removed(
    agent_in_sandbox: AgentFixture, plant: str, move: str, person: list[str]
) -> None:
    workspace, home = _workspace(agent_in_sandbox)
    first = sandboxed(workspace, plant.format(home=home) + " && echo planted")
    assert "planted" in first, first
    time.sleep(2.5)  # (past the guard's margin: the link is older than the next run)
    output = sandboxed(workspace, move + " && echo moved")
    assert "moved" in output, output
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", *G, *person],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (home / ".bashrc").read_text() == "precious\n", done.stdout + done.stderr
    assert sorted(path.name for path in home.iterdir()) == [".bashrc"]
    assert "as a symbolic link" in output, output
