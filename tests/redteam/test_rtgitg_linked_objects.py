"""Red team of the submodule git directory whose `objects` / `refs` are symbolic links
kept as they were (sandbox_git._put_back_links). A link naming a directory of the work
tree: the run writes what it names. With both `objects` and `refs` so linked, the run
removed the directory `refs` names (the submodule's git directory then no git directory
to git, which so stops refusing one nested in it) and copied a hand-built git directory
(a post-checkout hook) into the one `objects` names: the guard follows no link, so never
looked there, kept both links, and the person's `git submodule update --init` ran the
hook. Real bwrap, real git."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dispatcher.tools import sandbox
from dispatcher.tools.base import ToolError
from tests.redteam.test_git_metadata_guard import agent_in_sandbox, host_git, repository
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_git_metadata_guard_rt12 import G, evil_git_dir, submodule
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


def test_a_submodules_objects_linked_into_the_workspace_lets_no_unapproved_command_run(
    agent_in_sandbox: AgentFixture, tmp_path: Path
) -> None:
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    host_git(workspace, *G, "commit", "--allow-empty", "-qm", "base")
    submodule(workspace, "x")
    host_git(workspace, *G, "commit", "-qm", "with x")
    git_dir = workspace / ".git" / "modules" / "x"
    store = workspace / "store"
    store.mkdir()
    for name in ("objects", "refs"):
        shutil.move(git_dir / name, store / name)
        (git_dir / name).symlink_to(store / name)
    assert "base" in host_git(workspace / "x", "log", "--format=%s")
    mark = workspace / "hook-ran"
    commit = evil_git_dir(workspace, tmp_path / "src", mark)
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    name = "x/objects/evil"
    script = (
        "mv store/refs store/refs.away && cp -r evilgit store/objects/evil && "
        f"git config -f .gitmodules submodule.{name}.path evil && "
        f"git config -f .gitmodules submodule.{name}.url ./evil && "
        f"git update-index --add --cacheinfo 160000,{commit},evil && echo done"
    )
    with pytest.raises(ToolError, match="link into the workspace") as refused:
        output = sandboxed(workspace, script)
        host_git(workspace, *G, "submodule", "update", "--init")
        assert not mark.exists(), output
    assert "'.git/modules/x/objects'" in str(refused.value), refused.value
    assert not (store / "objects" / "evil").exists()
    assert "base" in host_git(workspace / "x", "log", "--format=%s")
