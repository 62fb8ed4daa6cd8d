"""Red team (rt2gitold) of the links the git guard keeps in a git directory whatever their
age (`objects`, `refs`, `lfs`, `annex`: a person's store elsewhere). One naming a
directory inside the workspace (`.git/objects -> ../store`) made that directory the git
directory's to git, but the work tree's to the guard, whose walk after a run looks for
links only in a git directory: an unapproved `ln -s /dev/zero store/info/alternates` (or
`myrefs/heads/x -> /dev/zero` under `refs -> ../myrefs`) had the person's real `git
status` (`git branch`) read without end. Now no unapproved command runs in such a
workspace; one naming a directory outside it is kept as before. Real bwrap, the person's
real git."""

from __future__ import annotations

import resource
import shutil
import subprocess
from pathlib import Path

import pytest

from dispatcher.tools.base import ToolError
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_git_metadata_guard_rt12 import G
from tests.redteam.test_rtgit_git_links import _workspace, agent_in_sandbox
from tests.redteam.test_rtgitold_leftovers import older_than_a_guard
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name

PLANT = {
    "objects": ("mkdir -p {store}/info && ln -sf /dev/zero {store}/info/alternates", "status"),
    "refs": ("ln -s /dev/zero {store}/heads/evil", "branch"),
}


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # (/dev/zero read whole)


def person_ends(workspace: Path, command: str) -> bool:
    """Whether the person's git `command` ends well within 10 s (and 1 GiB)."""
    try:
        done = subprocess.run(
            ["git", "-c", "safe.directory=*", *G, command],
            cwd=workspace,
            capture_output=True,
            timeout=10,
            check=False,
            preexec_fn=_limited,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def moved(workspace: Path, name: str, store: Path) -> None:
    """The person keeps `.git/NAME` in `store`, through a link older than any guard: in
    the workspace the sandbox's to write as the rest, else the person's (root here)."""
    shutil.move(workspace / ".git" / name, store)
    owner = "harness-sandbox" if store.is_relative_to(workspace) else "root"
    for path in [store, *store.rglob("*")]:
        shutil.chown(path, owner, owner)
    link = workspace / ".git" / name
    link.symlink_to(store)
    older_than_a_guard(link)


@pytest.mark.parametrize("name", ["objects", "refs"])
def test_a_kept_link_into_the_work_tree_lets_no_unapproved_command_hang_git(
    agent_in_sandbox: AgentFixture, name: str
) -> None:
    workspace, _ = _workspace(agent_in_sandbox)
    moved(workspace, name, workspace / "store")
    assert person_ends(workspace, PLANT[name][1])  # the person's setup works
    try:
        said = sandboxed(workspace, PLANT[name][0].format(store="store") + " && echo planted")
    except ToolError as refused:
        said = str(refused)
    assert person_ends(workspace, PLANT[name][1]), said  # (before: it hung, reading /dev/zero)
    assert f"'.git/{name}' (a link to" in said and "A reviewer must approve" in said, said


def test_a_kept_link_outside_the_workspace_still_runs(
    agent_in_sandbox: AgentFixture, tmp_path: Path
) -> None:
    """`.git/objects -> /srv/store` (here a directory of the test's): the command runs,
    and what it writes there is refused by the sandbox (outside the workspace)."""
    workspace, _ = _workspace(agent_in_sandbox)
    home = tmp_path
    moved(workspace, "objects", home / "store")
    output = sandboxed(workspace, "echo ran; ln -s /dev/zero .git/objects/info/alt || echo no")
    assert output.startswith("exit code 0\nran"), output
    assert not (home / "store" / "info" / "alt").exists()
    assert person_ends(workspace, "status")
