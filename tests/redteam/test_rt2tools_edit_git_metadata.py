"""A reviewer's edit of a write_file approves the new call only as git metadata was when
they were shown it (red team of the file tools' git re-check).

An edit is the editor's approval of what they wrote when the new call's diff is made
against the file they were shown; the worker then runs it as approved "knowing" what its
presentation, made at the edit, says of git metadata (write_file.changed_since compares
with that). Between the ask and the edit the agent's own allowed command turned the
path's directory into a link to the hooks directory (`ln -s .husky lib`): the editor,
shown `lib/pre-push` as an ordinary new file, approved by their edit a write of husky's
`.husky/pre-push`, never shown that it is a hook. Now the edit asks again, showing it
(approvals.services._same_git_warning)."""

from __future__ import annotations

from typing import Any

import pytest

from approvals import services as approval_services
from approvals.models import ApprovalRequest
from dispatcher.models import Status, ToolCall
from tests.policy.conftest import submit
from tests.redteam.test_git_hooks_since_approval import run_approved
from tests.redteam.test_git_metadata_guard import agent_in_sandbox, allow, host_git, repository
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


def test_an_edit_does_not_approve_a_path_that_became_a_hook_unseen(
    agent_in_sandbox: AgentFixture, reviewer: Any
) -> None:
    fx = agent_in_sandbox
    allow(fx)  # standard mode: write_file asks
    session_id, workspace = repository(fx)
    (workspace / ".husky").mkdir()
    host_git(workspace, "config", "core.hooksPath", ".husky")
    call = submit(fx, session_id, "w", "write_file", {"path": "lib/pre-push", "content": "a\n"})
    approval = ApprovalRequest.objects.get(call=call)
    assert "git_metadata" not in approval.presentation, approval.presentation
    (workspace / "lib").symlink_to(".husky")  # (the agent's allowed command)
    edit = approval_services.edit(
        approval_id=approval.pk,
        user=reviewer,
        digest=call.digest,
        arguments={"path": "lib/pre-push", "content": "exit 0\n"},
    )
    new = ToolCall.objects.get(pk=edit.replacement.pk)
    if new.status == Status.PENDING_APPROVAL:  # asked again, showing it: nothing to run yet
        shown = ApprovalRequest.objects.get(call=new).presentation
        assert "git hook" in shown.get("git_metadata", ""), shown
        return
    new = run_approved(new)
    assert not (workspace / ".husky" / "pre-push").exists(), (new.status, new.content)
