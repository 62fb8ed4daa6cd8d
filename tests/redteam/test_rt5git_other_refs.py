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
from dispatcher.models import Preview, Status, ToolCall
from dispatcher.tools import git_outside, preview
from tests.approvals.conftest import ask, start_session
from tests.approvals.test_preview_approval import _workspace, reviewer_client
from tests.approvals.test_preview_outside_git import (
    _approve,
    _git,
    _linked_worktree,
    _team,
    previews_on,
)
from tests.redteam.test_rt4git_symbolic_refs import _advance, _worktree
from tests.support.factories import AgentFixture

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
    outside = _team(tmp_path, settings)
    session_id = start_session(agent)
    workspace = _workspace(agent)
    _linked_worktree(workspace, outside)
    main = outside / "main"
    _git(main, "tag", "v1.0")
    approval = ask(agent, {"argv": COMMAND}, session_id=session_id, name="run_command")
    preview_row = Preview.objects.get(call=approval.call)
    assert preview_row.appliable, preview_row.note
    shown = next(c for c in preview_row.effect["changes"] if c["path"] == "TAGS")
    assert "+v1.0\n" in shown["diff"] and "v2.0" not in shown["diff"], shown
    _approve(reviewer_client, approval)

    # Between the approval and the apply, the person tags the same commit v2.0 in the
    # main repository (nothing of the workspace, HEAD, its branch or packed-refs touched).
    before = sorted(os.listdir(workspace))
    _git(main, "tag", "v2.0")
    assert sorted(os.listdir(workspace)) == before
    assert _git(main, "tag", "--points-at", "HEAD").split() == ["v1.0", "v2.0"]
    execution.execute_call(str(approval.call_id))

    original = ToolCall.objects.get(pk=approval.call_id)
    assert original.status == Status.EDITED, (original.status, original.content)
    assert "the workspace changed since the preview" in original.content
    assert not (workspace / "TAGS").exists()
    again = ToolCall.objects.get(edited_from=original)
    assert again.status == Status.PENDING_APPROVAL
    shown = next(c for c in again.preview.effect["changes"] if c["path"] == "TAGS")
    assert "+v2.0" in shown["diff"], shown


def _moves(main: Path, workspace: Path, how: str) -> None:
    if how == "branch":
        _advance(main, "other", "second")
    elif how == "tag":
        _git(main, "tag", "-f", "v1", "other~0")
        _advance(main, "other", "third")
        _git(main, "tag", "-f", "v1", "other")
    elif how == "nested-branch":
        _advance(main, "team/feature", "second")
    elif how == "main-orig-head":
        (main / ".git" / "ORIG_HEAD").write_text(_git(main, "rev-parse", "other"))
    elif how == "worktree-ref":
        _git(workspace, "update-ref", "refs/worktree/mark", "other")
    elif how == "reflog":
        _git(main, "reflog", "expire", "--expire=now", "--all")


@pytest.mark.parametrize(
    "how", ["branch", "tag", "nested-branch", "main-orig-head", "worktree-ref", "reflog"]
)
def test_the_fingerprint_takes_every_ref_and_reflog_git_may_read(tmp_path: Path, how: str) -> None:
    main, workspace = _worktree(tmp_path, "ws")
    _git(main, "branch", "other")
    _git(main, "branch", "team/feature")
    _git(main, "tag", "v1")
    seen = preview.fingerprint_of(workspace)
    assert preview.fingerprint_of(workspace) == seen  # (unchanged: the same)
    _moves(main, workspace, how)
    assert preview.fingerprint_of(workspace) != seen


def test_the_refs_described_are_bounded(tmp_path: Path) -> None:
    """Thousands of ref directories cost at most MAX_REF_DIRS listings, never the room of
    the configurations and hooks described beside them."""
    main, workspace = _worktree(tmp_path, "ws")
    heads = main / ".git" / "refs" / "heads"
    sha = _git(main, "rev-parse", "HEAD")
    for index in range(git_outside.MAX_REF_DIRS + 50):
        (heads / f"d{index}").mkdir()
        (heads / f"d{index}" / "x").write_text(sha)
    described = git_outside.outside_state(workspace, workspace, [".git"])
    listed = [line for line in described.splitlines() if f"{heads}/d" in line]
    assert len(listed) < git_outside.MAX_REF_DIRS, len(listed)
    assert "more refs" in described
    assert f"{main / '.git' / 'hooks'}\0" in described
