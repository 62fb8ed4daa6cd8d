"""A previewed effect is applied only while every ref git may read from outside the
workspace is as it was, not only HEAD's chain (red team of 285a00f, the preview's
fingerprint, git_outside.outside_state).

The fingerprint of a linked worktree (or of a workspace inside a repository) described
HEAD, the refs HEAD names, `packed-refs` and the index, but no other ref: a command that
reads another branch, a tag, a reflog or a pseudo-ref (`git describe --tags > VERSION`,
`git log -1 main`, `git reflog`, `ORIG_HEAD`) was previewed, the tag or branch moved
outside the workspace between the approval and the apply, and the effect previewed of
the old one was applied. Now the refs and logs directories of the git directories git
reads (and their pseudo-refs) are described, bounded. Real git, real bwrap, the
worker's own code path."""

from __future__ import annotations

import os
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
    ref_directories,
    session_repository,
    team,
    worktree,
)

pytestmark = pytest.mark.django_db
__all__ = ["previews_on", "reviewer_client"]  # the fixtures, used by name

COMMAND = ["sh", "-c", "git tag --points-at HEAD > TAGS; echo said"]


def test_a_tag_moved_after_the_approval_asks_again(
    previews_on: None,
    agent: AgentFixture,
    reviewer_client: Client,
    settings: Any,
    tmp_path: Path,
) -> None:
    outside = team(tmp_path, settings)
    session_id, workspace = session_repository(agent, linked_to=outside)
    main = outside / "main"
    git(main, "tag", "v1.0")
    approval, shown = approved_preview(agent, reviewer_client, session_id, COMMAND, "TAGS")
    assert "+v1.0\n" in shown and "v2.0" not in shown, shown

    # Between the approval and the apply, the person tags the same commit v2.0 in the
    # main repository (nothing of the workspace, HEAD, its branch or packed-refs touched).
    before = sorted(os.listdir(workspace))
    git(main, "tag", "v2.0")
    assert sorted(os.listdir(workspace)) == before
    assert git(main, "tag", "--points-at", "HEAD").split() == ["v1.0", "v2.0"]
    execution.execute_call(str(approval.call_id))

    _, shown = asked_again(approval, workspace, "TAGS")
    assert "+v2.0" in shown, shown


def _moves(main: Path, workspace: Path, how: str) -> None:
    if how == "branch":
        advance(main, "other", "second")
    elif how == "tag":
        git(main, "tag", "-f", "v1", "other~0")
        advance(main, "other", "third")
        git(main, "tag", "-f", "v1", "other")
    elif how == "nested-branch":
        advance(main, "team/feature", "second")
    elif how == "main-orig-head":
        (main / ".git" / "ORIG_HEAD").write_text(git(main, "rev-parse", "other"))
    elif how == "worktree-ref":
        git(workspace, "update-ref", "refs/worktree/mark", "other")
    elif how == "reflog":
        git(main, "reflog", "expire", "--expire=now", "--all")


@pytest.mark.parametrize(
    "how", ["branch", "tag", "nested-branch", "main-orig-head", "worktree-ref", "reflog"]
)
def test_the_fingerprint_takes_every_ref_and_reflog_git_may_read(tmp_path: Path, how: str) -> None:
    main, workspace = worktree(tmp_path, "ws")
    git(main, "branch", "other")
    git(main, "branch", "team/feature")
    git(main, "tag", "v1")
    assert_fingerprint_follows(workspace, lambda: _moves(main, workspace, how))


def test_the_refs_described_are_bounded(tmp_path: Path) -> None:
    """Thousands of ref directories cost at most MAX_REF_DIRS listings, never the room of
    the configurations and hooks described beside them."""
    main, workspace = worktree(tmp_path, "ws")
    heads = main / ".git" / "refs" / "heads"
    sha = git(main, "rev-parse", "HEAD")
    ref_directories(heads, git_outside.MAX_REF_DIRS + 50, sha)
    described = git_outside.outside_state(workspace, workspace, [".git"])
    listed = [line for line in described.splitlines() if f"{heads}/d" in line]
    assert len(listed) < git_outside.MAX_REF_DIRS, len(listed)
    assert "more refs" in described
    assert f"{main / '.git' / 'hooks'}\0" in described
