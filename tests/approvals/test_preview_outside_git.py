"""A previewed command's effect is applied only while what git reads from outside the
workspace is as it was when the command was previewed (red team of the previews: the
git guard's known gaps).

The fingerprint an effect is applied against walked the workspace alone. git run in it
reads configuration outside it too: a linked worktree's main repository (its `.git` a
file naming `main/.git/worktrees/ws`), a file its configuration includes, /etc/gitconfig;
changed between the approval and the apply, the command would now do something else, and
the effect previewed under the old one was applied all the same. Now what git reads from
outside is part of the fingerprint (`git_outside.outside_state`): the call ends `edited`
and a new preview, under the configuration as it is, asks again. Real git, real bwrap,
the worker's own code path; the outside configuration is shown to the sandbox by a
HARNESS_SANDBOX_READ_ONLY entry, as a deployment would."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from approvals.models import ApprovalRequest
from dispatcher import execution
from dispatcher.models import Preview, Status, ToolCall
from dispatcher.tools import sandbox
from tests.approvals.conftest import ask, start_session
from tests.approvals.test_preview_approval import _workspace, reviewer_client
from tests.support.factories import AgentFixture
from tests.support.git_preview import approve, team
from tests.support.git_preview import git as _git
from tests.support.git_preview import linked_worktree as _linked_worktree
from tests.tools.support import require_bwrap

pytestmark = pytest.mark.django_db
__all__ = ["reviewer_client"]  # the fixture, used by name

COMMAND = ["sh", "-c", "git config team.greeting > greeting.txt; echo said"]


@pytest.fixture
def previews_on(settings: Any) -> None:
    require_bwrap()
    if os.geteuid() != 0 or sandbox._owner() is None:
        pytest.skip("needs root: the outside repository must be one the sandbox user cannot write")
    settings.HARNESS_SANDBOX = "bwrap"
    settings.HARNESS_SANDBOX_NETWORK = False
    settings.HARNESS_PREVIEW = True
    settings.HARNESS_PREVIEW_TIMEOUT = 10


def _included(workspace: Path, outside: Path) -> Path:
    """The workspace's repository includes `outside/team.gitconfig`."""
    config = outside / "team.gitconfig"
    config.write_text("[team]\n\tgreeting = hello\n")
    _git(workspace, "init", "-q")
    _git(workspace, "config", "include.path", str(config))
    return config


@pytest.mark.parametrize("layout", ["include", "worktree"])
def test_git_configuration_changed_outside_the_workspace_asks_again(
    previews_on: None,
    agent: AgentFixture,
    reviewer_client: Client,
    settings: Any,
    tmp_path: Path,
    layout: str,
) -> None:
    outside = team(tmp_path, settings)
    session_id = start_session(agent)
    workspace = _workspace(agent)
    config = (_included if layout == "include" else _linked_worktree)(workspace, outside)
    approval = ask(agent, {"argv": COMMAND}, session_id=session_id, name="run_command")
    preview = Preview.objects.get(call=approval.call)
    assert preview.appliable, preview.note
    shown = next(c for c in preview.effect["changes"] if c["path"] == "greeting.txt")
    assert "hello" in shown["diff"], shown
    approve(reviewer_client, approval)

    # Between the approval and the apply, the configuration outside the workspace changes.
    config.write_text(config.read_text().replace("hello", "goodbye"))
    execution.execute_call(str(approval.call_id))

    original = ToolCall.objects.get(pk=approval.call_id)
    assert original.status == Status.EDITED, (original.status, original.content)
    assert "the workspace changed since the preview" in original.content
    assert not (workspace / "greeting.txt").exists()  # nothing applied, nothing run
    again = ToolCall.objects.get(edited_from=original)
    assert again.status == Status.PENDING_APPROVAL
    new_approval = ApprovalRequest.objects.get(call=again)
    assert new_approval.effect_digest != approval.effect_digest
    shown = next(c for c in again.preview.effect["changes"] if c["path"] == "greeting.txt")
    assert "goodbye" in shown["diff"] and "hello" not in shown["diff"], shown


def test_an_unchanged_outside_configuration_applies_the_effect(
    previews_on: None, agent: AgentFixture, reviewer_client: Client, settings: Any, tmp_path: Path
) -> None:
    outside = team(tmp_path, settings)
    session_id = start_session(agent)
    workspace = _workspace(agent)
    _linked_worktree(workspace, outside)
    approval = ask(agent, {"argv": COMMAND}, session_id=session_id, name="run_command")
    approve(reviewer_client, approval)
    execution.execute_call(str(approval.call_id))
    call = ToolCall.objects.get(pk=approval.call_id)
    assert call.status == Status.COMPLETED, (call.status, call.content)
    assert (workspace / "greeting.txt").read_text() == "hello\n"


def test_the_fingerprint_takes_each_git_file_read_from_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatcher.tools import preview, sandbox_git

    system = tmp_path / "gitconfig"
    system.write_text("[core]\n\tautocrlf = false\n")
    monkeypatch.setattr(sandbox_git, "SYSTEM_CONFIG", system)
    repository = tmp_path / "repo"  # the repository holding the workspace
    repository.mkdir()
    _git(repository, "init", "-q")
    workspace = repository / "ws"
    workspace.mkdir()
    _git(workspace, "init", "-q")
    shared = tmp_path / "shared.gitconfig"  # included, and (once set) including itself
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    _git(workspace, "config", "include.path", str(shared))
    _git(workspace, "config", "core.hooksPath", str(hooks))
    attributes = tmp_path / "attributes"  # (a filter named there runs on checkout)
    _git(workspace, "config", "core.attributesFile", str(attributes))
    shared.write_text(f"[include]\n\tpath = {shared}\n[hooks]\n\tx = 1\n")
    seen = {preview.fingerprint_of(workspace)}
    assert preview.fingerprint_of(workspace) in seen  # (unchanged: the same)
    changes: list[tuple[Path, str]] = [
        (system, "[core]\n\tautocrlf = true\n"),
        (repository / ".git" / "config", "[core]\n\tbare = false\n"),
        (repository / ".git" / "hooks" / "post-checkout", "#!/bin/sh\n"),
        (shared, f"[include]\n\tpath = {shared}\n[hooks]\n\tx = 2\n"),
        (hooks / "pre-commit", "#!/bin/sh\n"),
        (attributes, "* filter=team\n"),
    ]
    for path, text in changes:
        path.write_text(text)
        now = preview.fingerprint_of(workspace)
        assert now not in seen
        seen.add(now)
