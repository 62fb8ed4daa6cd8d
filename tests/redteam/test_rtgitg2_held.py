"""Red team (rtgitg2), what held: a directory git takes for a git directory by names of
other kinds (HEAD a symbolic link `refs/heads/master`, `objects` and `refs` executable
files, which git's `access(X_OK)` accepts) made by a command no person approved loses
its HEAD; a `.git` file a command made naming a repository hidden in `.git/objects/` is
removed. Real bwrap, real git (the sandbox's git refuses such a directory as a bare
repository: it is one to git)."""

from __future__ import annotations

import pytest

from tests.redteam.test_git_metadata_guard import agent_in_sandbox
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_gitg2_bare_repository import _nothing_ran, _plant, _workspace
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


def test_head_a_link_and_objects_refs_executable_files_lose_their_head(
    agent_in_sandbox: AgentFixture,
) -> None:
    _, workspace, marks = _workspace(agent_in_sandbox)
    script = (
        "R=src && ln -s refs/heads/master src/HEAD && printf '#!/bin/sh\\n' > src/objects "
        "&& cp src/objects src/refs && chmod +x src/objects src/refs && "
        "git -c safe.directory=* -C src rev-parse 2>&1 | grep -q 'bare repository' && "
    )
    output = sandboxed(workspace, script + _plant(marks) + " && echo made")
    assert "made" in output and "made 'src' a git directory" in output, output
    assert not (workspace / "src" / "HEAD").is_symlink()
    _nothing_ran(workspace / "src", marks)


def test_a_made_git_file_naming_a_repository_hidden_in_git_is_removed(
    agent_in_sandbox: AgentFixture,
) -> None:
    _, workspace, marks = _workspace(agent_in_sandbox)
    script = (
        "R=.git/objects/xx && git init -q --bare $R && "
        + _plant(marks)
        + " && echo 'gitdir: ../.git/objects/xx' > src/.git && echo made"
    )
    output = sandboxed(workspace, script)
    assert "made" in output and "it was removed" in output, output
    assert not (workspace / "src" / ".git").exists()
    _nothing_ran(workspace / "src", marks)
