"""A write_file or delete_file a reviewer approved runs with no git guard (they saw it):
the file tools' hook refusal (sandbox_git.hook_refusal) is for calls no person approved.
But the reviewer approved a change to a file that was no hook then: a command approved
meanwhile (`git config core.hooksPath .husky`, husky's install) made `.husky/` the hooks
directory, and the approved write, run after it, replaced the person's pre-commit hook
with the agent's, which their next commit ran (found by the git helper). Now the worker
judges the path again under the workspace lock before it runs an approved file tool's
call: git metadata the reviewer was not shown ends the call `edited` (nothing written,
the model told, audited) and asks again, showing it; approved knowing it, it runs. The
real worker, the real sandbox, the real git on the host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from approvals import services as approval_services
from approvals.models import ApprovalRequest
from audit import kinds
from audit.models import AuditEvent
from dispatcher import execution
from dispatcher.models import Status, ToolCall
from dispatcher.tools import preview, preview_apply, workspace_lock
from tests.policy.conftest import submit
from tests.redteam.test_git_metadata_guard import (
    agent_in_sandbox,
    allow,
    host_git,
    repository,
)
from tests.support.factories import AgentFixture
from tests.tools.test_preview import _preview, workspace

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox", "workspace"]  # the fixtures, used by name

PERSON = "#!/bin/sh\necho person-gate\nexit 1\n"  # the person's gate: no commit passes
AGENT = "#!/bin/sh\ntouch agent-ran\n"


def husky_not_installed(workspace: Path) -> Path:
    """The project's committed `.husky/pre-commit` (executable), which git does not run
    yet: no `core.hooksPath` (husky's install not run)."""
    (workspace / ".husky").mkdir()
    hook = workspace / ".husky" / "pre-commit"
    hook.write_text(PERSON)
    hook.chmod(0o755)
    return hook


def approve(call: ToolCall, reviewer: Any) -> None:
    assert call.status == Status.PENDING_APPROVAL, (call.status, call.reason)
    approval = ApprovalRequest.objects.get(call=call)
    approval_services.decide(
        approval_id=approval.pk, user=reviewer, approve=True, digest=call.digest
    )


def install_husky_approved(fx: AgentFixture, session_id: str, reviewer: Any) -> None:
    """A command a reviewer approves in between: git run in the sandbox sets the hooks
    directory (what husky's install does)."""
    argv = ["git", "config", "core.hooksPath", ".husky"]
    call = submit(fx, session_id, "install", "run_command", {"argv": argv})
    approve(call, reviewer)
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    assert call.status == Status.COMPLETED and call.content.startswith("exit code 0"), call.content


def run_approved(call: ToolCall) -> ToolCall:
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    return call


def asked_again(call: ToolCall) -> ToolCall:
    """The call ended `edited`, told so and audited, and the linked new call asks again,
    showing the reviewer that its path is git metadata now."""
    assert call.status == Status.EDITED, (call.status, call.content)
    assert "did not run" in call.content and "is now git metadata" in call.content
    event = AuditEvent.objects.get(subject=f"call:{call.pk}", kind=kinds.CALL_REPREVIEWED)
    assert "is now git metadata" in event.payload["reason"], event.payload
    again = ToolCall.objects.get(edited_from=call.pk)
    assert again.status == Status.PENDING_APPROVAL, (again.status, again.reason)
    approval = ApprovalRequest.objects.get(call=again)
    assert "hook" in approval.presentation.get("git_metadata", ""), approval.presentation
    return again


def page_of(approval: ApprovalRequest, reviewer: Any) -> str:
    client = Client()
    client.force_login(reviewer)
    return client.get(f"/approvals/{approval.pk}/").content.decode()


def test_an_approved_write_is_asked_again_when_its_file_became_a_hook(
    agent_in_sandbox: AgentFixture, reviewer: Any
) -> None:
    fx = agent_in_sandbox
    allow(fx)  # standard mode: run_command and write_file ask
    session_id, workspace = repository(fx)
    hook = husky_not_installed(workspace)
    args = {"path": ".husky/pre-commit", "content": AGENT}
    call = submit(fx, session_id, "w", "write_file", args)
    shown = ApprovalRequest.objects.get(call=call).presentation
    assert "git_metadata" not in shown, shown  # no hook yet: nothing to show
    approve(call, reviewer)
    install_husky_approved(fx, session_id, reviewer)
    call = run_approved(call)
    again = asked_again(call)
    assert hook.read_text() == PERSON  # nothing written
    out = host_git(workspace, "commit", "--allow-empty", "-qm", "x")
    assert "person-gate" in out and not (workspace / "agent-ran").exists(), out
    # shown to the reviewer, approved knowing it is a hook, it is written (git runs it)
    page = page_of(ApprovalRequest.objects.get(call=again), reviewer)
    assert "Git metadata: a call no person approved may not do this" in page, page
    assert "is a git hook of the workspace" in page, page
    approve(again, reviewer)
    again = run_approved(again)
    assert again.status == Status.COMPLETED and not again.is_error, again.content
    assert hook.read_text() == AGENT
    host_git(workspace, "commit", "--allow-empty", "-qm", "x")
    assert (workspace / "agent-ran").exists()


def test_an_approved_delete_is_asked_again_when_its_file_became_a_hook(
    settings: Any, agent_in_sandbox: AgentFixture, reviewer: Any
) -> None:
    settings.HARNESS_ALLOW_DESTRUCTIVE = True  # standard mode: delete_file asks too
    fx = agent_in_sandbox
    allow(fx)
    session_id, workspace = repository(fx)
    hook = husky_not_installed(workspace)
    call = submit(fx, session_id, "d", "delete_file", {"path": ".husky/pre-commit"})
    approve(call, reviewer)
    install_husky_approved(fx, session_id, reviewer)
    call = run_approved(call)
    asked_again(call)
    assert hook.read_text() == PERSON  # nothing deleted: the gate still stops a commit
    assert "person-gate" in host_git(workspace, "commit", "--allow-empty", "-qm", "x")


def test_an_approved_write_of_a_file_that_was_a_hook_when_shown_runs(
    agent_in_sandbox: AgentFixture, reviewer: Any
) -> None:
    """The other way: a reviewer shown that the file is a hook approved it knowing; the
    worker writes it as before (and an approved write of any other file too)."""
    fx = agent_in_sandbox
    allow(fx)
    session_id, workspace = repository(fx)
    hook = husky_not_installed(workspace)
    host_git(workspace, "config", "core.hooksPath", ".husky")
    call = submit(
        fx, session_id, "w", "write_file", {"path": ".husky/pre-commit", "content": AGENT}
    )
    shown = ApprovalRequest.objects.get(call=call).presentation
    assert "git hook" in shown.get("git_metadata", ""), shown
    approve(call, reviewer)
    call = run_approved(call)
    assert call.status == Status.COMPLETED and not call.is_error, call.content
    assert hook.read_text() == AGENT
    other = submit(fx, session_id, "o", "write_file", {"path": "src/a.py", "content": "1\n"})
    approve(other, reviewer)
    other = run_approved(other)
    assert other.status == Status.COMPLETED and not other.is_error, other.content
    assert (workspace / "src" / "a.py").read_text() == "1\n"


def test_a_previewed_effect_is_not_applied_once_hooks_were_configured_since(
    workspace: Path,
) -> None:
    """A previewed command's approved effect needs no such check: it is applied only to
    a workspace whose every entry is as it was previewed (its fingerprint), and the
    configuration that names a hooks directory is one of them. (Passed before: it keeps
    the docs' claim true.)"""
    host_git(workspace, "init", "-q")
    hook = husky_not_installed(workspace)
    effect = _preview(workspace, ["sh", "-c", f"printf '{AGENT}' > .husky/pre-commit"])
    assert [change["path"] for change in effect.changes] == [".husky/pre-commit"]
    host_git(workspace, "config", "core.hooksPath", ".husky")
    with workspace_lock.held(workspace):
        assert preview_apply.check(effect, workspace) == "the workspace changed since the preview"
    preview.discard(effect.store)
    assert hook.read_text() == PERSON
