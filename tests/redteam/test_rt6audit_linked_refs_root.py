"""A previewed effect is applied only while every ref git reads is as it was, the
workspace's whole `refs/` (or `logs/`) kept as a link too (red team of 8f8b9a13).

8f8b9a13 follows a link among the entries of the refs directories, but the walk's root,
`.git/refs` itself, when it is a link out of the workspace, was scanned through the link
by its path in the workspace: every directory and tag under it taken for the
workspace's own (which the workspace's walk takes as one link, never entering it), so
nothing under it was described. A tag moved in the directory the link names changed
what `git tag --points-at HEAD > TAGS` writes and left the fingerprint as it was."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from dispatcher.tools import preview
from tests.support.git_preview import assert_fingerprint_follows, git, repository


def test_a_refs_directory_kept_as_a_link_outside_moved_tag_changes_the_fingerprint(
    tmp_path: Path,
) -> None:
    workspace = repository(tmp_path / "ws", commits=("init", "second"))
    git(workspace, "tag", "v1", "HEAD~1")
    team = tmp_path / "team"
    team.mkdir()
    shutil.move(workspace / ".git" / "refs", team / "refs")
    os.symlink(team / "refs", workspace / ".git" / "refs")
    assert git(workspace, "tag", "--points-at", "HEAD").split() == []

    def move() -> None:
        # The tag moves onto HEAD, written in place under the linked directory.
        (team / "refs" / "tags" / "v1").write_text(git(workspace, "rev-parse", "HEAD"))
        assert git(workspace, "tag", "--points-at", "HEAD").split() == ["v1"]

    assert_fingerprint_follows(workspace, move)


def test_a_refs_directory_kept_as_a_link_to_itself_or_proc_ends(tmp_path: Path) -> None:
    """A link of the reflogs' root to /proc, to the root or to itself: the fingerprint
    ends, the same while nothing changed (no guard of the fix's: it held before too)."""
    workspace = repository(tmp_path / "ws", commits=("init",))
    logs = workspace / ".git" / "logs"
    shutil.rmtree(logs)
    for target in ("/proc/self/cwd", "/", str(logs)):
        if logs.is_symlink():
            logs.unlink()
        os.symlink(target, logs)
        first = preview.fingerprint_of(workspace)
        assert len(first) == 64
        if target != "/":  # (the root's directories move as the host runs)
            assert preview.fingerprint_of(workspace) == first
