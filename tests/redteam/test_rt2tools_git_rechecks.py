"""delete_file in a workspace whose git hooks cannot be told (red team of the file tools'
git re-check).

`core.hooksPath = .husky` in a repository with a linked worktree (each worktree runs its
own copy): the guard cannot bind `.husky/` read-only, so it lets no unapproved command
run and no unapproved write_file write anything. delete_file took "cannot be told" as
"no hook": a delete_file no person approved removed the person's `.husky/pre-commit` (a
secret scanner, a lint gate), and their next commit passed without it; and a delete a
reviewer approved before the hooks were configured ran after, never asked again. Now it
is refused the same way (a reviewer may approve it), and an approved one asks again."""

from __future__ import annotations

import subprocess
from pathlib import Path

from dispatcher.tools import delete_file, write_file
from dispatcher.tools.base import ExecutionContext, ToolError

PERSON = "#!/bin/sh\necho person-gate\nexit 1\n"  # the person's gate: no commit passes


def _git(workspace: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stdout + done.stderr


def _repository(tmp_path: Path) -> tuple[Path, Path]:
    """A repository with husky's committed `.husky/pre-commit`; (workspace, hook)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    _git(workspace, "init", "-q")
    _git(workspace, "config", "user.email", "a@example.org")
    _git(workspace, "config", "user.name", "A")
    _git(workspace, "commit", "--allow-empty", "-qm", "first")
    (workspace / ".husky").mkdir()
    hook = workspace / ".husky" / "pre-commit"
    hook.write_text(PERSON)
    hook.chmod(0o755)
    return workspace, hook


def _hooks_with_a_worktree(workspace: Path, tmp_path: Path) -> None:
    _git(workspace, "config", "core.hooksPath", ".husky")
    _git(workspace, "worktree", "add", "-q", str(tmp_path / "other"))
    assert (workspace / ".git" / "worktrees").is_dir()


def test_an_unapproved_delete_of_a_hook_that_cannot_be_told_is_refused(tmp_path: Path) -> None:
    workspace, hook = _repository(tmp_path)
    _hooks_with_a_worktree(workspace, tmp_path)
    assert "person-gate" in _git(workspace, "commit", "--allow-empty", "-qm", "x")
    ctx = ExecutionContext(workspace=workspace, call_id="d", timeout=30, output_limit=4000)
    try:
        said = str(delete_file.TOOL.execute(ctx, {"path": ".husky/pre-commit"}))
    except ToolError as refused:
        said = f"refused: {refused}"
    assert said.startswith("refused: '.husky/pre-commit' was not deleted"), said
    assert "A call a reviewer approves may delete it" in said, said
    assert hook.read_text() == PERSON
    assert "person-gate" in _git(workspace, "commit", "--allow-empty", "-qm", "x")


def test_an_approved_delete_is_asked_again_once_its_hooks_cannot_be_told(tmp_path: Path) -> None:
    workspace, _hook = _repository(tmp_path)
    arguments = {"path": ".husky/pre-commit"}
    shown = delete_file.present_delete(arguments, workspace)
    assert "git_metadata" not in shown, shown  # no hook when the reviewer saw it
    _hooks_with_a_worktree(workspace, tmp_path)  # (commands approved meanwhile)
    why = delete_file.changed_since(arguments, workspace, shown)
    assert why is not None and "is now git metadata" in why, why
    # shown to the reviewer, approved knowing it, it is not asked again
    again = delete_file.present_delete(arguments, workspace)
    assert "was not deleted" in again["git_metadata"], again
    assert delete_file.changed_since(arguments, workspace, again) is None


def test_a_path_that_became_a_hook_through_a_linked_parent_is_asked_again(
    tmp_path: Path,
) -> None:
    """(Passed before.) `lib -> .husky`, made after the ask by a command (the agent's own,
    allowed: the workspace is its to write): the approved write or delete of
    `lib/pre-commit` is the hook's, judged as resolved."""
    workspace, hook = _repository(tmp_path)
    _git(workspace, "config", "core.hooksPath", ".husky")
    arguments = {"path": "lib/pre-commit", "content": "exit 0\n"}
    (workspace / "lib").mkdir()
    shown_write = write_file.present_write(arguments, workspace)
    shown_delete = delete_file.present_delete({"path": "lib/pre-commit"}, workspace)
    assert "git_metadata" not in shown_write and "git_metadata" not in shown_delete
    (workspace / "lib").rmdir()
    (workspace / "lib").symlink_to(".husky")
    why = write_file.changed_since(arguments, workspace, shown_write)
    assert why is not None and "is now git metadata" in why, why
    why = delete_file.changed_since({"path": "lib/pre-commit"}, workspace, shown_delete)
    assert why is not None and "is now git metadata" in why, why
    assert hook.read_text() == PERSON
