"""Review of the git preview's fingerprint (git_outside._OutsideState.directory): the
links of a hooks or info directory are followed to what git reads through them, at most
MAX_LISTED of them. Past that bound the rest were dropped with no gap said, for a
directory of the workspace's own git directory too (which `_listed` never sees: only a
directory outside is described by its entries): 1,000 links to files of the workspace
sorted before `pre-commit -> /team/pre-commit` left the team's hook unwatched, the
preview appliable, and its old effect applied after the hook changed.

And a diff or merge tool's command line as git documents it (`meld "$LOCAL" "$MERGED"
"$REMOTE"`) was taken for the shell's to read: a gap, and no git preview of such a
repository appliable (git_outside._unread_command)."""

from __future__ import annotations

from pathlib import Path

import pytest

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


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("mergetool.meld.cmd", 'meld "$LOCAL" "$MERGED" "$REMOTE"'),
        ("difftool.vscode.cmd", "code --wait --diff $LOCAL $REMOTE"),
        ("mergetool.kdiff3.cmd", 'kdiff3 "$BASE" "$LOCAL" "$REMOTE" --output="$MERGED"'),
    ],
)
def test_a_diff_or_merge_tool_as_git_documents_it_is_no_gap(
    tmp_path: Path, key: str, value: str
) -> None:
    """A diff or merge tool's command line names the files git gives it by the variables
    git sets ($LOCAL, $REMOTE, $MERGED, $BASE), as git's documentation writes it: no
    program or file outside the workspace hides in them, and the preview of any git
    command stays appliable (before, every git preview of such a repository, `git status`
    included, was not appliable: "a command line Harness cannot read whole ('"$LOCAL"')")."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    _git(workspace, "init", "-q")
    _git(workspace, "config", key, value)
    assert preview.fingerprint_with_gaps(workspace)[1] == []


@pytest.mark.parametrize(
    "value",
    ['meld "$TEAM/x" "$LOCAL"', "meld $LOCAL;sh /team/x", "$LOCAL $REMOTE", 'meld "$LOCAL x"'],
)
def test_other_variables_in_a_merge_tool_are_still_a_gap(tmp_path: Path, value: str) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    _git(workspace, "init", "-q")
    _git(workspace, "config", "mergetool.x.cmd", value)
    gaps = preview.fingerprint_with_gaps(workspace)[1]
    assert any("cannot read whole" in gap for gap in gaps), gaps


@pytest.mark.parametrize(
    "key", ["mergetool.x.path", "difftool.x.path", "browser.x.path", "man.x.path"]
)
def test_a_tool_path_with_a_space_changed_after_the_preview_changes_the_fingerprint(
    tmp_path: Path, key: str
) -> None:
    """A diff or merge tool's, a browser's or a man viewer's `path` is one path, run as
    git's scripts run it ("$merge_tool_path", quoted): `/team/my tools/meld` is that
    program, not `/team/my` and the work tree's `tools/meld`. Before, taken for those two
    words, the program itself was never described, and changed after the approval it
    left the fingerprint as it was (the old effect applied)."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    _git(workspace, "init", "-q")
    program = tmp_path / "team" / "my tools" / "meld"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    _git(workspace, "config", key, str(program))
    before, gaps = preview.fingerprint_with_gaps(workspace)
    assert gaps == []
    program.write_text("#!/bin/sh\nexit 1\n")  # (the same size, in place)
    assert preview.fingerprint_with_gaps(workspace)[0] != before
