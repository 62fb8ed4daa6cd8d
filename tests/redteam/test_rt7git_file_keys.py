"""Red team of the git preview's fingerprint (git_outside.outside_state_and_gaps): a key
of a git configuration that makes git read a file or directory outside the workspace,
which the fingerprint neither described nor counted as a gap.

`mailmap.file = /team/mailmap` makes `git shortlog` and `git log` print the names the
team's mailmap gives; `diff.orderFile`, `blame.ignoreRevsFile`, `format.signatureFile`,
`gpg.ssh.allowedSignersFile`, `fsck.skipList`, `commit.template` and an ssh
`user.signingKey` are files git reads too; `core.worktree` moves the whole work tree and
`init.templateDir` is copied into each repository `git init` makes. None of these keys
was read: the configuration naming them was not even parsed (its cheap test knew only
`path`, `hooksPath`, `attributesFile`, `excludesFile`), so the file outside changing
after the approval left the fingerprint as it was, the preview appliable, and the old
effect was applied. Real git, real bwrap, the worker's own code path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from approvals.models import ApprovalRequest
from dispatcher import execution
from dispatcher.tools import git_outside, preview
from tests.approvals.test_preview_approval import reviewer_client
from tests.approvals.test_preview_outside_git import previews_on
from tests.support.factories import AgentFixture
from tests.support.git_preview import (
    approved_preview,
    asked_again,
    assert_fingerprint_follows,
    git,
    outside_file,
    ref_directories,
    repository,
    session_repository,
    team,
    worktree,
)

pytestmark = pytest.mark.django_db
__all__ = ["previews_on", "reviewer_client"]  # the fixtures, used by name


def test_a_team_mailmap_changed_after_the_approval_asks_again(
    previews_on: None,
    agent: AgentFixture,
    reviewer_client: Client,
    settings: Any,
    tmp_path: Path,
) -> None:
    mailmap = team(tmp_path, settings) / "mailmap"
    mailmap.write_text("Alice <a@b> A <a@b>\n")
    session_id, workspace = session_repository(agent)
    git(workspace, "commit", "-q", "--allow-empty", "-m", "init")
    git(workspace, "config", "mailmap.file", str(mailmap))
    argv = ["sh", "-c", "git shortlog -sn HEAD > AUTHORS; echo said"]
    approval, shown = approved_preview(agent, reviewer_client, session_id, argv, "AUTHORS")
    assert "Alice" in shown, shown

    # Between the approval and the apply, the team's mailmap (outside the workspace)
    # renames the author: what the command writes now differs.
    mailmap.write_text("Mallory <a@b> A <a@b>\n")
    execution.execute_call(str(approval.call_id))

    again, shown = asked_again(approval, workspace, "AUTHORS")
    new_approval = ApprovalRequest.objects.get(call=again)
    assert new_approval.effect_digest != approval.effect_digest
    assert "Mallory" in shown and "Alice" not in shown, shown


# (key, what the file outside holds) for a file git reads when the key names it
FILE_KEYS = [
    ("mailmap.file", "Alice <a@b> A <a@b>\n"),
    ("diff.orderFile", "b\na\n"),
    ("blame.ignoreRevsFile", "0" * 40 + "\n"),
    ("format.signatureFile", "-- \nthe team\n"),
    ("gpg.ssh.allowedSignersFile", "a@b ssh-ed25519 AAAA\n"),
    ("gpg.ssh.revocationFile", "\n"),
    ("fsck.skipList", "0" * 40 + "\n"),
    ("fetch.fsck.skipList", "0" * 40 + "\n"),
    ("receive.fsck.skipList", "0" * 40 + "\n"),
    ("commit.template", "the team's message\n"),
    ("user.signingKey", "-----BEGIN OPENSSH PRIVATE KEY-----\n"),
    ("sendemail.aliasesFile", "alias a a@b\n"),
]


@pytest.mark.parametrize(("key", "content"), FILE_KEYS)
@pytest.mark.parametrize("spelling", ["git", "written"])
def test_a_file_a_configuration_names_outside_is_watched(
    tmp_path: Path, key: str, content: str, spelling: str
) -> None:
    """The file outside changed in place (its content only): the fingerprint differs."""
    workspace = repository(tmp_path / "ws")
    outside = outside_file(tmp_path, content)
    if spelling == "git":
        git(workspace, "config", key, str(outside))
    else:  # (as a person writes it: a section header, the key on the same line)
        section, _, name = key.rpartition(".")
        header = section.replace(".", ' "', 1) + '"' if "." in section else section
        with (workspace / ".git" / "config").open("a") as config:
            config.write(f"[{header}] {name.upper()}={outside}\n")
    assert git(workspace, "config", key).strip() == str(outside)
    # (a file described whole: the preview stays appliable)
    change = content.replace("a", "b") + "more\n"
    assert_fingerprint_follows(workspace, lambda: outside.write_text(change), whole=True)


def test_a_work_tree_moved_outside_the_workspace_is_a_gap(tmp_path: Path) -> None:
    """`core.worktree = /team/tree`: `git status`, `git diff`, `git ls-files` read a work
    tree Harness does not walk."""
    workspace = repository(tmp_path / "ws")
    tree = tmp_path / "team" / "tree"
    tree.mkdir(parents=True)
    (tree / "a.txt").write_text("a\n")
    git(workspace, "config", "core.worktree", str(tree))
    before, gaps = preview.fingerprint_with_gaps(workspace)
    (tree / "sub").mkdir()
    (tree / "sub" / "b.txt").write_text("b\n")
    after = preview.fingerprint_with_gaps(workspace)[0]
    assert gaps or after != before, gaps
    assert any("core.worktree" in gap for gap in gaps), gaps


def test_a_work_tree_inside_the_workspace_is_no_gap(tmp_path: Path) -> None:
    """A submodule's `core.worktree = ../../../sub` (its work tree in the workspace, which
    the walk describes) keeps the preview appliable."""
    workspace = repository(tmp_path / "ws")
    modules = workspace / ".git" / "modules" / "sub"
    modules.mkdir(parents=True)
    git(modules, "init", "-q", "--bare")
    git(modules, "config", "core.bare", "false")
    git(modules, "config", "core.worktree", "../../../sub")
    (workspace / "sub").mkdir()
    (workspace / "sub" / ".git").write_text("gitdir: ../.git/modules/sub\n")
    assert preview.fingerprint_with_gaps(workspace)[1] == []


def test_a_template_directory_outside_is_watched(tmp_path: Path) -> None:
    """`init.templateDir = /team/templates`: `git init sub` copies its hooks; a hook
    changed in place there after the approval changes what is made."""
    workspace = repository(tmp_path / "ws")
    templates = tmp_path / "team" / "templates"
    (templates / "hooks").mkdir(parents=True)
    hook = templates / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\nexit 0\n")
    git(workspace, "config", "init.templateDir", str(templates))
    # (a template directory, described whole, keeps previews appliable; the hook changed
    # in place, the same size)
    change = "#!/bin/sh\nexit 1\n"
    assert_fingerprint_follows(workspace, lambda: hook.write_text(change), whole=True)


def test_a_team_exclude_linked_from_the_git_directory_changed_after_the_approval_asks_again(
    previews_on: None,
    agent: AgentFixture,
    reviewer_client: Client,
    settings: Any,
    tmp_path: Path,
) -> None:
    """`.git/info/exclude -> /team/exclude` (git follows it; the workspace's walk takes
    the link alone): the team's excludes changed after the approval change what `git
    status` says."""
    exclude = team(tmp_path, settings) / "exclude"
    exclude.write_text("secret.txt\n")
    session_id, workspace = session_repository(agent)
    (workspace / ".git" / "info" / "exclude").unlink()
    (workspace / ".git" / "info" / "exclude").symlink_to(exclude)
    (workspace / "secret.txt").write_text("s\n")
    argv = ["sh", "-c", "git status --porcelain > STATUS; echo said"]
    approval, shown = approved_preview(agent, reviewer_client, session_id, argv, "STATUS")
    assert "secret.txt" not in shown, shown

    exclude.write_text("nothing\n")  # (after the approval: secret.txt is shown now)
    execution.execute_call(str(approval.call_id))

    _, shown = asked_again(approval, workspace, "STATUS")
    assert "secret.txt" in shown, shown


@pytest.mark.parametrize(
    "layout", ["hook", "hooks-directory", "info-exclude", "sparse-checkout", "info-attributes"]
)
def test_a_link_of_the_git_directory_to_a_file_outside_is_followed(
    tmp_path: Path, layout: str
) -> None:
    """A hook, the hooks directory, or a file of `info/` the workspace's git directory
    links to outside it: what git reads through the link changed in place changes the
    fingerprint."""
    workspace = repository(tmp_path / "ws")
    git_dir = workspace / ".git"
    if layout == "hooks-directory":
        (tmp_path / "team" / "hooks").mkdir(parents=True)
        target = outside_file(tmp_path, "#!/bin/sh\nexit 0\n", "hooks/pre-commit")
        for entry in (git_dir / "hooks").iterdir():
            entry.unlink()
        (git_dir / "hooks").rmdir()
        (git_dir / "hooks").symlink_to(target.parent)
    else:
        where = {
            "hook": git_dir / "hooks" / "pre-commit",
            "info-exclude": git_dir / "info" / "exclude",
            "sparse-checkout": git_dir / "info" / "sparse-checkout",
            "info-attributes": git_dir / "info" / "attributes",
        }[layout]
        target = outside_file(tmp_path, "#!/bin/sh\nexit 0\n")
        where.unlink(missing_ok=True)
        where.symlink_to(target)
    # (the same size, in place)
    change = "#!/bin/sh\nexit 1\n"
    assert_fingerprint_follows(workspace, lambda: target.write_text(change), whole=True)


def test_many_ref_directories_of_the_workspace_are_no_gap(tmp_path: Path) -> None:
    """The workspace's own repository with more directories of refs than MAX_REF_DIRS
    (remote branches in per-person namespaces, `origin/<user>/<topic>`): its walk
    describes each entry, so the preview stays appliable; and a ref among the last of
    them linked outside is still followed."""
    workspace = repository(tmp_path / "ws", commits=("one",))
    sha = git(workspace, "rev-parse", "HEAD")
    remotes = workspace / ".git" / "refs" / "remotes" / "origin"
    ref_directories(remotes, git_outside.MAX_REF_DIRS + 50, sha, "user", "topic")
    outside = outside_file(tmp_path, sha, "ref")
    (remotes / "user000" / "linked").symlink_to(outside)
    # (in place: the link and its directory as they were)
    change = "0" * 40 + "\n"
    assert_fingerprint_follows(workspace, lambda: outside.write_text(change), whole=True)


def test_ref_directories_outside_never_take_the_room_of_the_configuration(
    tmp_path: Path,
) -> None:
    """A linked worktree's main repository with fewer ref directories than MAX_REF_DIRS but
    more than the room MAX_OUTSIDE leaves: its configuration is described all the same,
    and the preview is appliable (before, a gap: "more than 256 files and directories")."""
    main, workspace = worktree(tmp_path, "ws")
    sha = git(main, "rev-parse", "HEAD")
    ref_directories(main / ".git" / "refs" / "heads", git_outside.MAX_REF_DIRS - 20, sha)
    described, gaps = git_outside.outside_state_and_gaps(workspace, workspace, [".git"])
    assert gaps == []
    assert f"{main / '.git' / 'config'}\0" in described
