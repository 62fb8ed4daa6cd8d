"""A previewed effect is applied only while every ref git follows from a linked worktree's
HEAD is as it was, however many symbolic refs lie on the way (red team of the preview's
fingerprint, git_outside.outside_state; a finding lost before it landed).

The fingerprint read the worktree's HEAD and the ref HEAD names. A ref may itself be
symbolic (`git symbolic-ref refs/heads/ws refs/heads/final`, or a link to `refs/...`),
and git follows such a chain up to SYMREF_MAXDEPTH reads: a commit to the final branch
between the approval and the apply left HEAD and `refs/heads/ws` as they were, and the
effect previewed of the old commit (`git log -1 > last.txt`) was applied all the same.
Now each ref of the chain is described, as git resolves it: the call ends `edited` and a
new preview asks again. Real git, real bwrap, the worker's own code path."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from dispatcher import execution
from dispatcher.tools import git_outside
from tests.approvals.test_preview_approval import reviewer_client
from tests.approvals.test_preview_outside_git import previews_on
from tests.support.factories import AgentFixture
from tests.support.git_preview import (
    advance,
    approved_preview,
    asked_again,
    assert_fingerprint_follows,
    git,
    outside_file,
    repository,
    session_repository,
    team,
    worktree,
)

pytestmark = pytest.mark.django_db
__all__ = ["previews_on", "reviewer_client"]  # the fixtures, used by name

COMMAND = ["sh", "-c", "git log -1 --format=%s > last.txt; echo said"]


def test_a_commit_to_the_branch_a_symbolic_ref_names_after_the_approval_asks_again(
    previews_on: None,
    agent: AgentFixture,
    reviewer_client: Client,
    settings: Any,
    tmp_path: Path,
) -> None:
    outside = team(tmp_path, settings)
    session_id, workspace = session_repository(agent, linked_to=outside)
    main = outside / "main"
    # The worktree's branch is a symbolic ref to `final`: HEAD -> ws -> final.
    branch = git(workspace, "symbolic-ref", "--short", "HEAD").strip()
    git(main, "branch", "final")
    git(main, "symbolic-ref", f"refs/heads/{branch}", "refs/heads/final")
    approval, shown = approved_preview(agent, reviewer_client, session_id, COMMAND, "last.txt")
    assert "+init" in shown, shown

    # Between the approval and the apply, the person commits to `final` (HEAD and
    # `refs/heads/ws` unchanged, nothing of the workspace touched).
    before = sorted(os.listdir(workspace))
    advance(main, "final", "second")
    assert sorted(os.listdir(workspace)) == before
    assert git(workspace, "log", "-1", "--format=%s").strip() == "second"
    execution.execute_call(str(approval.call_id))

    _, shown = asked_again(approval, workspace, "last.txt")
    assert "+second" in shown, shown


@pytest.mark.parametrize("how", ["file", "link"])
def test_the_fingerprint_follows_a_chain_of_symbolic_refs_as_far_as_git_does(
    tmp_path: Path, how: str
) -> None:
    main, workspace = worktree(tmp_path, "ws")
    # HEAD -> ws -> a -> b -> final: git's fifth and last read is `final`'s.
    chain = ["ws", "a", "b", "final"]
    git(main, "branch", "final")
    heads = main / ".git" / "refs" / "heads"
    for name, named in zip(chain, chain[1:], strict=False):
        if how == "file":
            git(main, "symbolic-ref", f"refs/heads/{name}", f"refs/heads/{named}")
        else:  # (git takes a link whose target starts with `refs/` for a symbolic ref)
            (heads / name).unlink(missing_ok=True)
            (heads / name).symlink_to(f"refs/heads/{named}")
    assert git(workspace, "rev-parse", "--symbolic-full-name", "HEAD").strip() == (
        "refs/heads/final"
    )

    def commit() -> None:
        advance(main, "final", "second")
        assert git(workspace, "log", "-1", "--format=%s").strip() == "second"

    assert_fingerprint_follows(workspace, commit)


def test_a_ref_past_the_depth_git_follows_is_not_read(tmp_path: Path) -> None:
    """git resolves no HEAD whose chain needs more than SYMREF_MAXDEPTH reads, and what
    lies past it changes nothing git does: it is not described (nor read at all)."""
    main, workspace = worktree(tmp_path, "r0")
    depth = git_outside.SYMREF_MAXDEPTH
    for level in range(depth):
        git(main, "branch", f"r{level + 1}")
        git(main, "symbolic-ref", f"refs/heads/r{level}", f"refs/heads/r{level + 1}")
    assert git(workspace, "rev-parse", "r1").strip()  # (within git's depth: resolved)
    unresolved = subprocess.run(
        ["git", "-c", "safe.directory=*", "rev-parse", "--verify", "-q", "HEAD"],
        cwd=workspace,
        capture_output=True,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1"},
    )
    assert unresolved.returncode != 0, unresolved  # (HEAD: past git's depth)
    described = git_outside.outside_state(workspace, workspace, [".git"])
    heads = str(main / ".git" / "refs" / "heads")
    assert f"{heads}/r{depth - 2}\0" in described
    assert f"{heads}/r{depth - 1}\0" not in described


@pytest.mark.parametrize("name", ["refs/heads/main", "packed-refs", "HEAD"])
def test_a_git_file_of_the_workspace_linked_outside_it_is_taken_by_what_git_reads(
    tmp_path: Path, name: str
) -> None:
    """git follows a link in its git directory (a ref, `packed-refs`, HEAD, whose target
    does not start with `refs/`) and reads the file outside; the walk takes the link
    alone, so the file it names is described too."""
    workspace = repository(tmp_path / "ws", "-b", "main", commits=("init",))
    here = workspace / ".git" / name
    outside = outside_file(tmp_path, here.read_text() if here.exists() else "")
    here.unlink(missing_ok=True)
    here.symlink_to(outside)
    # (in place: the link unchanged)
    assert_fingerprint_follows(workspace, lambda: outside.write_text(outside.read_text() + "\n"))
