"""Set-ups of the git preview's fingerprint tests (git_outside, preview.fingerprint_of):
repositories and files outside a workspace, a live session's repository, and the
approval a changed file outside makes ask again. Real git, run as a person would."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.test import Client

from approvals.models import ApprovalRequest
from dispatcher.models import AgentSession, Preview, Status, ToolCall
from dispatcher.tools import preview, sandbox
from tests.approvals.conftest import ask, start_session
from tests.support.factories import AgentFixture


def git(where: Path, *args: str) -> str:
    """`git args` in `where` (no user or system configuration): its output; it succeeded."""
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", "-c", "user.email=a@b", "-c", "user.name=A", *args],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def repository(path: Path, *init: str, commits: tuple[str, ...] = ()) -> Path:
    """`path`, a new directory, made a git repository (`git init -q init...`) with an
    empty commit of each subject of `commits`, in turn."""
    path.mkdir()
    git(path, "init", "-q", *init)
    for subject in commits:
        git(path, "commit", "--allow-empty", "-qm", subject)
    return path


def outside_file(tmp_path: Path, content: str, name: str = "file") -> Path:
    """`tmp_path/team/name`, holding `content`: a file outside a workspace below
    `tmp_path`."""
    path = tmp_path / "team" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(content)
    return path


def outside_program(tmp_path: Path) -> Path:
    """`tmp_path/bin/tool`, a program outside a workspace below `tmp_path`."""
    program = tmp_path / "bin" / "tool"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\n")
    return program


def ref_directories(parent: Path, count: int, sha: str, prefix: str = "d", ref: str = "x") -> None:
    """`count` ref directories `parent/<prefix>NNN`, each with one ref `ref` at `sha`."""
    for index in range(count):
        directory = parent / f"{prefix}{index:03}"
        directory.mkdir(parents=True)
        (directory / ref).write_text(sha)


def assert_fingerprint_follows(
    workspace: Path, change: Callable[[], object], *, whole: bool = False
) -> None:
    """The fingerprint of `workspace` is the same read twice and differs once `change`
    has run; with `whole`, it is taken with no gap (the preview stays appliable)."""
    seen, gaps = preview.fingerprint_with_gaps(workspace)
    if whole:
        assert gaps == [], gaps
    assert preview.fingerprint_of(workspace) == seen  # (unchanged: the same)
    change()
    assert preview.fingerprint_of(workspace) != seen


def team(tmp_path: Path, settings: Any) -> Path:
    """`tmp_path/team`, a directory outside the workspace the sandbox shows read-only (a
    HARNESS_SANDBOX_READ_ONLY entry, as a deployment would)."""
    os.chmod(tmp_path, 0o755)  # noqa: S103 - the sandbox user passes through
    outside = tmp_path / "team"
    outside.mkdir(mode=0o755)
    settings.HARNESS_SANDBOX_READ_ONLY = [str(outside)]
    return outside


def linked_worktree(workspace: Path, outside: Path) -> Path:
    """The workspace is a linked worktree of `outside/main`, whose configuration (outside
    the workspace) git reads for it."""
    main = outside / "main"
    main.mkdir()
    git(main, "init", "-q")
    git(main, "commit", "--allow-empty", "-qm", "init")
    git(main, "config", "team.greeting", "hello")
    git(main, "worktree", "add", "-q", "--force", str(workspace))
    # (git in the sandbox, as the sandbox user, takes only a git directory of its own)
    owner = sandbox._owner()
    assert owner is not None
    for top, directories, files in os.walk(main / ".git" / "worktrees"):
        for name in [".", *directories, *files]:
            os.chown(os.path.join(top, name), *owner)
    return main / ".git" / "config"


def session_repository(agent: AgentFixture, linked_to: Path | None = None) -> tuple[str, Path]:
    """(a new session of `agent`, its workspace): a git repository of its own, or with
    `linked_to` a linked worktree of `linked_to/main`."""
    session_id = start_session(agent)
    session = AgentSession.objects.filter(agent=agent.agent).latest("created_at")
    workspace = Path(session.workspace)
    if linked_to is None:
        git(workspace, "init", "-q")
    else:
        linked_worktree(workspace, linked_to)
    return session_id, workspace


def approve(client: Client, approval: ApprovalRequest) -> None:
    """The reviewer approves the call and the effect shown."""
    data = {"action": "approve", "digest": approval.call.digest}
    data["effect_digest"] = approval.effect_digest
    response = client.post(f"/approvals/{approval.pk}/decide", data)
    assert response.status_code in (200, 302), response.content


def approved_preview(
    agent: AgentFixture, client: Client, session_id: str, argv: list[str], path: str
) -> tuple[ApprovalRequest, str]:
    """Ask `argv` in the session, see its preview appliable, approve it: (the approval,
    the diff the preview showed of `path`)."""
    approval = ask(agent, {"argv": argv}, session_id=session_id, name="run_command")
    row = Preview.objects.get(call=approval.call)
    assert row.appliable, row.note
    shown = next(c for c in row.effect["changes"] if c["path"] == path)
    approve(client, approval)
    return approval, str(shown["diff"])


def asked_again(approval: ApprovalRequest, workspace: Path, path: str) -> tuple[ToolCall, str]:
    """The approved call, run after what its fingerprint takes changed, was not applied
    (`path` not written) but ended `edited`, and a new call asks again: (that call, the
    diff its new preview shows of `path`)."""
    original = ToolCall.objects.get(pk=approval.call_id)
    assert original.status == Status.EDITED, (original.status, original.content)
    assert "the workspace changed since the preview" in original.content
    assert not (workspace / path).exists()  # the old effect was not applied
    again = ToolCall.objects.get(edited_from=original)
    assert again.status == Status.PENDING_APPROVAL
    shown = next(c for c in again.preview.effect["changes"] if c["path"] == path)
    return again, str(shown["diff"])


def worktree(tmp_path: Path, branch: str) -> tuple[Path, Path]:
    """(`main`, a repository with one commit; `ws`, its linked worktree on `branch`)."""
    main = repository(tmp_path / "main", commits=("init",))
    workspace = tmp_path / "ws"
    git(main, "worktree", "add", "-q", "-b", branch, str(workspace))
    return main, workspace


def advance(main: Path, branch: str, subject: str) -> None:
    """A new commit on `branch` made from the main repository, touching no work tree and
    no index (`commit-tree` and `update-ref`): only the branch's ref changes."""
    made = git(main, "commit-tree", f"{branch}^{{tree}}", "-p", branch, "-m", subject)
    git(main, "update-ref", f"refs/heads/{branch}", made.strip())
