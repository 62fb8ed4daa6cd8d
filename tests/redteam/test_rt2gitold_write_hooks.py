"""write_file writes outside the sandbox, so the read-only binds the git guard gives a
`core.hooksPath` directory (husky's `.husky/`) and the file a hook links to
(`.git/hooks/pre-commit -> ../../scripts/pre-commit.sh`) never held it: a write_file a
rule allowed overwrote `.husky/pre-commit` or `scripts/pre-commit.sh`, and the person's
next `git commit` ran the agent's code (found by the rt2gitold helper). So did a file a
`[include]` of `.git/config` names, in a workspace where no unapproved command runs. Such
a write now needs a reviewer's approval; every other write runs as before. The real
worker, the real git on the host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher import execution
from dispatcher.models import Status
from dispatcher.policy import profiles
from tests.policy.conftest import submit
from tests.redteam.test_git_metadata_file_tools import allow_writes, run
from tests.redteam.test_git_metadata_guard import host_git, repository
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

PERSON = "#!/bin/sh\necho person-hook\n"
AGENT = "#!/bin/sh\ntouch agent-ran\n"


def husky(workspace: Path) -> str:
    (workspace / ".husky").mkdir()
    hook = workspace / ".husky" / "pre-commit"
    hook.write_text(PERSON)
    hook.chmod(0o755)
    host_git(workspace, "config", "core.hooksPath", ".husky")
    return ".husky/pre-commit"


def linked(workspace: Path) -> str:
    (workspace / "scripts").mkdir()
    script = workspace / "scripts" / "pre-commit.sh"
    script.write_text(PERSON)
    script.chmod(0o755)
    (workspace / ".git" / "hooks" / "pre-commit").symlink_to("../../scripts/pre-commit.sh")
    return "scripts/pre-commit.sh"


def linked_by_another_name(workspace: Path) -> str:
    linked(workspace)
    (workspace / "tools").symlink_to("scripts")
    return "tools/pre-commit.sh"


def included(workspace: Path) -> str:
    (workspace / "shared.gitconfig").write_text("[user]\n\tname = A\n")
    host_git(workspace, "config", "include.path", "../shared.gitconfig")
    return "shared.gitconfig"


@pytest.mark.parametrize(
    "plant",
    [husky, linked, linked_by_another_name, included],
    ids=["husky", "linked-hook", "linked-hook-through-a-link", "included-config"],
)
def test_an_allowed_write_file_changes_no_hook_outside_git(
    settings: Any, agent: AgentFixture, plant: Any
) -> None:
    settings.HARNESS_PREVIEW = False
    fx = agent
    allow_writes(fx)
    session_id, workspace = repository(fx)
    path = plant(workspace)
    before = (workspace / path).read_bytes()
    content = "[core]\n\tfsmonitor = touch agent-ran\n" if path.endswith("gitconfig") else AGENT
    call = run(fx, session_id, "plant", path, content)
    assert call.status == Status.COMPLETED and call.is_error, (call.status, call.content)
    assert "A call a reviewer approves may write it" in call.content, call.content
    assert (workspace / path).read_bytes() == before
    host_git(workspace, "status")
    out = host_git(workspace, "commit", "--allow-empty", "-qm", "x")
    assert not (workspace / "agent-ran").exists()
    if plant is not included:
        assert "person-hook" in out, out  # the premise: git runs what is there
    # the workspace's other files are written as before (but where no command runs)
    other = run(fx, session_id, "src", "scripts/other.sh", "echo 1\n")
    if plant is included:
        assert other.is_error, other.content
    else:
        assert other.status == Status.COMPLETED and not other.is_error, other.content
        assert (workspace / "scripts" / "other.sh").read_text() == "echo 1\n"


def test_a_write_where_no_hook_is_taken_from_is_written(settings: Any, agent: AgentFixture) -> None:
    """The premise of the above, the other way: a workspace with no hook outside `.git`
    writes as before, and the husky hook the agent wrote ran (git runs what is there)."""
    settings.HARNESS_PREVIEW = False
    fx = agent
    allow_writes(fx)
    session_id, workspace = repository(fx)
    call = run(fx, session_id, "w", ".husky/pre-commit", AGENT)
    assert call.status == Status.COMPLETED and not call.is_error, call.content
    (workspace / ".husky" / "pre-commit").chmod(0o700)
    host_git(workspace, "config", "core.hooksPath", ".husky")
    host_git(workspace, "commit", "--allow-empty", "-qm", "x")
    assert (workspace / "agent-ran").exists()


@pytest.mark.parametrize(
    "path", [".git/hooks/pre-commit", ".husky/pre-commit", "meta/hooks/pre-commit"]
)
def test_an_allowed_delete_file_removes_no_hook_of_the_persons(
    settings: Any, agent: AgentFixture, path: str
) -> None:
    """delete_file runs outside the sandbox too: an allowed one removed the person's
    pre-commit hook (a secret scanner, a lint gate), and their next commit, which it
    would have stopped, went through."""
    settings.HARNESS_PREVIEW = False
    fx = agent
    profiles.update_profile(
        user=fx.owner, mode="standard", allow=["delete_file"], ask=[], deny=[], actor="test"
    )
    session_id, workspace = repository(fx)
    husky(workspace)
    (workspace / "meta").symlink_to(".git")
    gate = "#!/bin/sh\necho person-gate\nexit 1\n"
    for hook in (workspace / ".git" / "hooks" / "pre-commit", workspace / ".husky" / "pre-commit"):
        hook.write_text(gate)
        hook.chmod(0o700)
    call = submit(fx, session_id, "rm", "delete_file", {"path": path})
    assert call.status == Status.QUEUED, (call.status, call.reason)
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    assert call.is_error and "Nothing was deleted" in call.content, call.content
    if path.startswith(".husky"):
        assert "person-gate" in host_git(workspace, "commit", "--allow-empty", "-qm", "x")
    else:
        assert (workspace / ".git" / "hooks" / "pre-commit").read_text() == gate
    # the workspace's other files are deleted as before
    (workspace / "old.txt").write_text("x\n")
    other = submit(fx, session_id, "rm2", "delete_file", {"path": "old.txt"})
    execution.execute_call(str(other.pk))
    other.refresh_from_db()
    assert not other.is_error and not (workspace / "old.txt").exists(), other.content
