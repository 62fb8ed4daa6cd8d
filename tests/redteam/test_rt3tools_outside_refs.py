"""A linked worktree's HEAD, index and branch lie outside the workspace, and a previewed
effect is applied only while they are as they were (red team of the preview's
fingerprint, git_outside.outside_state).

The fingerprint took the main repository's configuration, hooks and info, but not what
git reads as the worktree's state: its HEAD and index (`main/.git/worktrees/ws/`) and the
branch HEAD names (`main/.git/refs/heads/ws`, or `packed-refs`). A commit made to the
branch between the approval and the apply (the person's own, from the main repository)
left the fingerprint as it was, and the effect previewed of the old commit (`git log -1
> last.txt`, a `git checkout -- .` of the old index) was applied all the same. Now they
are described too: the call ends `edited` and a new preview asks again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from dispatcher import execution
from tests.approvals.test_preview_approval import reviewer_client
from tests.approvals.test_preview_outside_git import previews_on
from tests.support.factories import AgentFixture
from tests.support.git_preview import (
    approved_preview,
    asked_again,
    git,
    session_repository,
    team,
)

pytestmark = pytest.mark.django_db
__all__ = ["previews_on", "reviewer_client"]  # the fixtures, used by name

COMMAND = ["sh", "-c", "git log -1 --format=%s > last.txt; echo said"]


def test_a_commit_to_the_worktrees_branch_after_the_approval_asks_again(
    previews_on: None,
    agent: AgentFixture,
    reviewer_client: Client,
    settings: Any,
    tmp_path: Path,
) -> None:
    outside = team(tmp_path, settings)
    session_id, workspace = session_repository(agent, linked_to=outside)
    approval, shown = approved_preview(agent, reviewer_client, session_id, COMMAND, "last.txt")
    assert "+init" in shown, shown

    # Between the approval and the apply, the person commits to the worktree's branch
    # (outside the workspace: its objects, its ref, the worktree's logs).
    before = sorted(os.listdir(workspace))
    git(workspace, "commit", "--allow-empty", "-qm", "second")
    assert sorted(os.listdir(workspace)) == before
    execution.execute_call(str(approval.call_id))

    _, shown = asked_again(approval, workspace, "last.txt")
    assert "+second" in shown, shown
