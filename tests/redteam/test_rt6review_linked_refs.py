"""A previewed effect is applied only while every ref git reads is as it was, a ref kept
as a link too (review of c85b43c, git_outside's `_ref_trees`).

git reads a loose ref that is a symbolic link to a file (not to `refs/...`) through the
link, and a directory of `refs/` that is a link through it (files_read_raw_ref, the loose
refs' listing): `refs/tags/v1 -> /team/v1` is the tag the file holds. The fingerprint
described each entry of the refs directories by its own state (lstat), a link by the
link alone, and the workspace's own refs not at all (its walk takes a link as a link):
the tag moved by a write to the file it names, and the effect previewed of the old one
(`git tag --points-at HEAD > TAGS`) was applied. Real git, the worker's fingerprint."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatcher.tools import preview
from tests.support.git_preview import assert_fingerprint_follows, git, repository, worktree


def _tagged(tmp_path: Path, where: str, how: str) -> tuple[Path, Path]:
    """(the workspace; the file outside it holding the tag v1's commit) for a repository
    whose tag v1 is a link (`how`: the ref's file, or its directory) to a file outside,
    in the workspace's own git directory or in its main repository's (`where`)."""
    if where == "own":
        workspace = repository(tmp_path / "ws", commits=("init",))
        git_dir = workspace / ".git"
    else:
        main, workspace = worktree(tmp_path, "ws")
        git_dir = main / ".git"
    git(workspace, "commit", "--allow-empty", "-qm", "second")
    team = tmp_path / "team"
    team.mkdir()
    held = team / "v1"
    held.write_text(git(workspace, "rev-parse", "HEAD~1"))
    if how == "file":
        os.symlink(held, git_dir / "refs" / "tags" / "v1")
    else:
        os.rmdir(git_dir / "refs" / "tags")
        os.symlink(team, git_dir / "refs" / "tags")
    assert git(workspace, "tag", "--points-at", "HEAD").split() == []
    return workspace, held


@pytest.mark.parametrize("how", ["file", "directory"])
@pytest.mark.parametrize("where", ["own", "main"])
def test_a_tag_kept_as_a_link_outside_moved_changes_the_fingerprint(
    tmp_path: Path, where: str, how: str
) -> None:
    workspace, held = _tagged(tmp_path, where, how)

    def move() -> None:
        # The tag moves onto HEAD: the file the link names is written in place (its
        # inode, the link and every directory of the repository as they were).
        before = sorted(os.listdir(workspace))
        held.write_text(git(workspace, "rev-parse", "HEAD"))
        assert git(workspace, "tag", "--points-at", "HEAD").split() == ["v1"]
        assert sorted(os.listdir(workspace)) == before

    assert_fingerprint_follows(workspace, move)


def test_a_pseudo_ref_kept_as_a_link_outside_moved_changes_the_fingerprint(
    tmp_path: Path,
) -> None:
    workspace = repository(tmp_path / "ws", commits=("init", "second"))
    held = tmp_path / "orig"
    held.write_text(git(workspace, "rev-parse", "HEAD~1"))
    os.symlink(held, workspace / ".git" / "ORIG_HEAD")
    seen = preview.fingerprint_of(workspace)
    held.write_text(git(workspace, "rev-parse", "HEAD"))
    assert git(workspace, "rev-parse", "ORIG_HEAD") == git(workspace, "rev-parse", "HEAD")
    assert preview.fingerprint_of(workspace) != seen


def test_a_shallow_boundary_moved_in_the_main_repository_changes_the_fingerprint(
    tmp_path: Path,
) -> None:
    """git reads the common directory's `shallow` for any history (`git rev-list --count
    HEAD > N`, `git log`): a boundary written there after a preview changed what the
    command would write, with no ref or configuration changed."""
    main, workspace = worktree(tmp_path, "ws")
    git(workspace, "commit", "--allow-empty", "-qm", "second")
    git(workspace, "commit", "--allow-empty", "-qm", "third")
    seen = preview.fingerprint_of(workspace)
    assert git(workspace, "rev-list", "--count", "HEAD").strip() == "3"
    (main / ".git" / "shallow").write_text(git(workspace, "rev-parse", "HEAD~1"))
    assert git(workspace, "rev-list", "--count", "HEAD").strip() == "2"
    assert preview.fingerprint_of(workspace) != seen
