"""Review of the git preview's fingerprint (git_outside._OutsideState.directory): the
links of a hooks or info directory are followed to what git reads through them, at most
MAX_LISTED of them. Past that bound the rest were dropped with no gap said, for a
directory of the workspace's own git directory too (which `_listed` never sees: only a
directory outside is described by its entries): 1,000 links to files of the workspace
sorted before `pre-commit -> /team/pre-commit` left the team's hook unwatched, the
preview appliable, and its old effect applied after the hook changed."""

from __future__ import annotations

from pathlib import Path

from dispatcher.tools import git_outside, preview
from tests.approvals.test_preview_outside_git import _git


def test_links_of_a_hooks_directory_past_the_bound_are_a_gap(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    _git(workspace, "init", "-q")
    hooks = workspace / ".git" / "hooks"
    for entry in hooks.iterdir():
        entry.unlink()
    inside = workspace / "notes.txt"
    inside.write_text("")
    for index in range(git_outside.MAX_LISTED):
        (hooks / f"a{index:04}").symlink_to(inside)  # (sorted before `pre-commit`)
    team = tmp_path / "team"
    team.mkdir()
    hook = team / "pre-commit"
    hook.write_text("#!/bin/sh\nexit 0\n")
    (hooks / "pre-commit").symlink_to(hook)
    before, gaps = preview.fingerprint_with_gaps(workspace)
    hook.write_text("#!/bin/sh\nexit 1\n")  # (the same size, in place)
    after = preview.fingerprint_with_gaps(workspace)[0]
    assert after != before or any(str(hooks) in gap for gap in gaps), gaps
    assert any(f"more than {git_outside.MAX_LISTED} links" in gap for gap in gaps), gaps


def test_links_of_a_hooks_directory_within_the_bound_are_followed(tmp_path: Path) -> None:
    """The same directory with its team hook among the first MAX_LISTED links: no gap,
    and the hook changed in place changes the fingerprint."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    _git(workspace, "init", "-q")
    hooks = workspace / ".git" / "hooks"
    for entry in hooks.iterdir():
        entry.unlink()
    inside = workspace / "notes.txt"
    inside.write_text("")
    for index in range(git_outside.MAX_LISTED - 1):
        (hooks / f"a{index:04}").symlink_to(inside)
    team = tmp_path / "team"
    team.mkdir()
    hook = team / "pre-commit"
    hook.write_text("#!/bin/sh\nexit 0\n")
    (hooks / "pre-commit").symlink_to(hook)
    before, gaps = preview.fingerprint_with_gaps(workspace)
    assert gaps == []
    hook.write_text("#!/bin/sh\nexit 1\n")
    assert preview.fingerprint_with_gaps(workspace)[0] != before
