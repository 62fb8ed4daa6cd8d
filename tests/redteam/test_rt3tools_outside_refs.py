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
from dispatcher.models import Preview, Status, ToolCall
from tests.approvals.conftest import ask, start_session
from tests.approvals.test_preview_approval import _workspace, reviewer_client
from tests.approvals.test_preview_outside_git import _git, _linked_worktree, previews_on
from tests.support.factories import AgentFixture

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
    os.chmod(tmp_path, 0o755)  # noqa: S103 - the sandbox user passes through
    outside = tmp_path / "team"
    outside.mkdir(mode=0o755)
    settings.HARNESS_SANDBOX_READ_ONLY = [str(outside)]
    session_id = start_session(agent)
    workspace = _workspace(agent)
    _linked_worktree(workspace, outside)
    approval = ask(agent, {"argv": COMMAND}, session_id=session_id, name="run_command")
    preview = Preview.objects.get(call=approval.call)
    assert preview.appliable, preview.note
    shown = next(c for c in preview.effect["changes"] if c["path"] == "last.txt")
    assert "+init" in shown["diff"], shown
    data = {"action": "approve", "digest": approval.call.digest}
    data["effect_digest"] = approval.effect_digest
    response = reviewer_client.post(f"/approvals/{approval.pk}/decide", data)
    assert response.status_code in (200, 302), response.content

    # Between the approval and the apply, the person commits to the worktree's branch
    # (outside the workspace: its objects, its ref, the worktree's logs).
    before = sorted(os.listdir(workspace))
    _git(workspace, "commit", "--allow-empty", "-qm", "second")
    assert sorted(os.listdir(workspace)) == before
    execution.execute_call(str(approval.call_id))

    original = ToolCall.objects.get(pk=approval.call_id)
    assert original.status == Status.EDITED, (original.status, original.content)
    assert not (workspace / "last.txt").exists()
    again = ToolCall.objects.get(edited_from=original)
    assert again.status == Status.PENDING_APPROVAL
    shown = next(c for c in again.preview.effect["changes"] if c["path"] == "last.txt")
    assert "+second" in shown["diff"], shown
