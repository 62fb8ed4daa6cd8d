"""write_file writes outside the sandbox, so the sandbox's read-only binds of git metadata
(dispatcher.tools.sandbox_git) never held it: a write_file a rule or a mode allowed could
write `.git/hooks/pre-commit` or `.git/config` (core.fsmonitor), directly or through a
link to `.git`, and a person's next `git commit` or `git status` ran it (found by the
gitg2 helper). Such a write now needs a reviewer's approval of the call; every other
write runs as before. The real worker, the real git on the host."""

from __future__ import annotations

from typing import Any

import pytest

from approvals import services as approval_services
from approvals.models import ApprovalRequest
from dispatcher import execution
from dispatcher.models import Status, ToolCall
from dispatcher.policy import profiles
from tests.policy.conftest import submit
from tests.redteam.test_git_metadata_guard import host_git, repository
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

HOOK = "#!/bin/sh\ntouch hook-ran\n"


def allow_writes(fx: AgentFixture) -> None:
    profiles.update_profile(
        user=fx.owner, mode="standard", allow=["write_file"], ask=[], deny=[], actor="test"
    )


def run(fx: AgentFixture, session_id: str, call_id: str, path: str, content: str) -> ToolCall:
    call = submit(fx, session_id, call_id, "write_file", {"path": path, "content": content})
    assert call.status == Status.QUEUED, (call.status, call.reason)
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    return call


@pytest.mark.parametrize(
    ("path", "link"),
    [
        (".git/hooks/pre-commit", False),
        (".git/config", False),
        (".git/info/attributes", False),
        ("meta/hooks/pre-commit", True),  # meta -> .git
    ],
    ids=["hook", "config", "info", "through-a-link"],
)
def test_an_allowed_write_file_plants_nothing_git_runs(
    settings: Any, agent: AgentFixture, path: str, link: bool
) -> None:
    settings.HARNESS_PREVIEW = False
    fx = agent
    allow_writes(fx)
    session_id, workspace = repository(fx)
    if link:
        (workspace / "meta").symlink_to(".git")
    before = (workspace / ".git" / "config").read_text()
    content = HOOK if "hooks" in path else "[core]\n\tfsmonitor = touch fsmonitor-ran\n"
    call = run(fx, session_id, "plant", path, content)
    assert call.status == Status.COMPLETED and call.is_error, (call.status, call.content)
    assert "is git metadata that makes git run programs" in call.content
    assert "A call a reviewer approves may write it" in call.content
    assert not (workspace / ".git" / "hooks" / "pre-commit").exists()
    assert (workspace / ".git" / "config").read_text() == before
    host_git(workspace, "status")
    host_git(workspace, "commit", "--allow-empty", "-qm", "x")
    assert not (workspace / "hook-ran").exists() and not (workspace / "fsmonitor-ran").exists()
    # the workspace's own files are written as before
    assert run(fx, session_id, "src", "src/app.py", "print(1)\n").status == Status.COMPLETED
    assert (workspace / "src" / "app.py").read_text() == "print(1)\n"


def test_a_reviewer_approved_write_file_still_writes_a_hook(
    settings: Any, agent: AgentFixture, reviewer: Any
) -> None:
    settings.HARNESS_PREVIEW = False
    fx = agent
    session_id, workspace = repository(fx)  # standard mode: write_file asks
    call = submit(
        fx, session_id, "hook", "write_file", {"path": ".git/hooks/pre-commit", "content": HOOK}
    )
    assert call.status == Status.PENDING_APPROVAL
    approval = ApprovalRequest.objects.get(call=call)
    approval_services.decide(
        approval_id=approval.pk, user=reviewer, approve=True, digest=call.digest
    )
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    assert call.status == Status.COMPLETED, call.content
    hook = workspace / ".git" / "hooks" / "pre-commit"
    assert hook.read_text() == HOOK
    hook.chmod(0o700)  # (write_file makes no file executable)
    host_git(workspace, "commit", "--allow-empty", "-qm", "x")
    assert (workspace / "hook-ran").exists()  # the premise: git runs what is written there
