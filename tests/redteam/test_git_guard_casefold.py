"""The file tools' git refusal on a case-insensitive file system (red team of the git
guard: its known gaps).

The tools compared names exactly: `.githooks` (a `core.hooksPath` directory) and
`.git/hooks` are what they refuse, and on a file system that matches names whatever
their case (exFAT, vfat, ext4 or tmpfs with casefold: a workspace on a USB disk or a
share) `.GITHOOKS/pre-commit` and `.GIT/hooks/pre-commit` name the same files. An
unapproved write_file overwrote the person's hook by the other name, and an unapproved
delete_file removed their `.git/hooks/pre-commit`. Names are now compared as such a file
system compares them (case folded), and a directory of a hook path is also known by its
device and inode. Needs root, a loop device and exfat-fuse (Debian packages exfat-fuse,
exfatprogs): the one case-insensitive file system this machine mounts (its kernel has no
casefold, no vfat)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import sandbox_git
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.delete_file import TOOL as DELETE_FILE
from dispatcher.tools.write_file import TOOL as WRITE_FILE
from tests.redteam.test_git_metadata_guard import host_git as _git

PERSON = "#!/bin/sh\necho person-gate\n"
AGENT = "#!/bin/sh\necho agent-ran\n"


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def folding(tmp_path: Path, settings: Any) -> Iterator[Path]:
    """A directory on an exFAT file system (case-insensitive), mounted through a loop
    device by exfat-fuse; skipped where that cannot be made. (Harness as root with the
    bwrap sandbox gives what a file tool writes to the sandbox user, which exFAT, having
    no owners, refuses: the write fails there anyway. An unprivileged Harness gives
    nothing, as with HARNESS_SANDBOX "off", and writes.)"""
    settings.HARNESS_SANDBOX = "off"
    if not all(shutil.which(name) for name in ("mkfs.exfat", "mount.exfat-fuse", "losetup")):
        message = (
            "needs exfatprogs and exfat-fuse (a case-insensitive file system): "
            "apt-get install exfatprogs exfat-fuse (make test installs them)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and " + message)
        pytest.skip(message)
    image, mount = tmp_path / "exfat.img", tmp_path / "mnt"
    mount.mkdir()
    with image.open("wb") as handle:
        handle.truncate(32 << 20)
    if _run("mkfs.exfat", str(image)).returncode != 0:
        pytest.skip("mkfs.exfat failed")
    attached = _run("losetup", "-f", "--show", str(image))
    if attached.returncode != 0:
        pytest.skip(f"no loop device: {attached.stderr.strip()}")
    device = attached.stdout.strip()
    try:
        mounted = _run("mount.exfat-fuse", device, str(mount))
        if mounted.returncode != 0:
            pytest.skip(f"exfat-fuse cannot mount here: {mounted.stderr.strip()}")
        try:
            (mount / "probe").mkdir()
            assert (mount / "PROBE").is_dir(), "the file system folds case"
            yield mount
        finally:
            _run("umount", str(mount))
    finally:
        _run("losetup", "-d", device)


def _repository(folding: Path, hooks_path: str | None) -> Path:
    workspace = folding / "ws"
    workspace.mkdir()
    _git(workspace, "init", "-q")
    for directory in (".githooks", ".git/hooks"):
        (workspace / directory).mkdir(exist_ok=True)
        (workspace / directory / "pre-commit").write_text(PERSON)
    if hooks_path is not None:
        _git(workspace, "config", "core.hooksPath", hooks_path)
    return workspace


def _call(tool: object, workspace: Path, arguments: dict[str, str]) -> str:
    ctx = ExecutionContext(workspace=workspace, call_id="cf", timeout=30, output_limit=4000)
    try:
        return str(tool.execute(ctx, arguments))  # type: ignore[attr-defined]
    except ToolError as refused:
        return f"refused: {refused}"


@pytest.mark.parametrize("name", [".GITHOOKS/pre-commit", ".GitHooks/pre-commit"])
def test_a_hooks_path_hook_written_by_another_case_is_refused(folding: Path, name: str) -> None:
    workspace = _repository(folding, ".githooks")
    assert sandbox_git.hook_paths(workspace) == [".githooks"]
    said = _call(WRITE_FILE, workspace, {"path": name, "content": AGENT})
    assert said.startswith(f"refused: '{name}' is a git hook"), said
    assert (workspace / ".githooks" / "pre-commit").read_text() == PERSON
    said = _call(DELETE_FILE, workspace, {"path": name})
    assert said.startswith(f"refused: '{name}' is git metadata"), said
    assert (workspace / ".githooks" / "pre-commit").read_text() == PERSON
    assert _call(WRITE_FILE, workspace, {"path": "src.txt", "content": "x"}).startswith("Wrote")


def test_a_hooks_path_named_in_another_case_refuses_the_written_name(folding: Path) -> None:
    # (the person's configuration names `.GitHooks`; the agent writes `.githooks/...`)
    workspace = _repository(folding, ".GitHooks")
    assert sandbox_git.hook_paths(workspace) == [".GitHooks"]
    said = _call(WRITE_FILE, workspace, {"path": ".githooks/pre-commit", "content": AGENT})
    assert said.startswith("refused: '.githooks/pre-commit' is a git hook"), said
    assert (workspace / ".githooks" / "pre-commit").read_text() == PERSON


@pytest.mark.parametrize("name", [".GIT/hooks/pre-commit", ".Git/HOOKS/pre-commit"])
def test_a_git_directorys_hook_deleted_by_another_case_is_refused(folding: Path, name: str) -> None:
    workspace = _repository(folding, None)
    said = _call(DELETE_FILE, workspace, {"path": name})
    assert said.startswith(f"refused: '{name}' is git metadata"), said
    assert (workspace / ".git" / "hooks" / "pre-commit").read_text() == PERSON
    said = _call(WRITE_FILE, workspace, {"path": name, "content": AGENT})
    assert said.startswith("refused:"), said
    assert (workspace / ".git" / "hooks" / "pre-commit").read_text() == PERSON


def test_guarded_names_fold_case() -> None:
    # (what an effect rule is refused by: the paths a preview's effect names)
    assert sandbox_git.guarded_path(".GIT/HOOKS/pre-commit")
    assert sandbox_git.guarded_path("sub/.Git/Config")
    assert sandbox_git.guarded_path(".git/MODULES/lib/Hooks/x")
    assert not sandbox_git.guarded_path(".git/OBJECTS/hooks/x")
    assert not sandbox_git.guarded_path("src/hooks/config")


def test_a_hooks_directory_by_another_name_is_known_by_its_identity(
    tmp_path: Path, settings: Any
) -> None:
    # (as ext4's casefold gives one directory's every spelling: the same inode; here a
    # bind mount gives `.githooks` another name, `alias/`, on a file system keeping case)
    settings.HARNESS_SANDBOX = "off"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    _git(workspace, "init", "-q")
    (workspace / ".githooks").mkdir()
    hook = workspace / ".githooks" / "pre-commit"
    hook.write_text(PERSON)
    _git(workspace, "config", "core.hooksPath", ".githooks")
    (workspace / "alias").mkdir()
    if _run("mount", "--bind", str(workspace / ".githooks"), str(workspace / "alias")).returncode:
        pytest.skip("needs root to bind a directory onto another name")
    try:
        said = _call(WRITE_FILE, workspace, {"path": "alias/pre-commit", "content": AGENT})
        assert said.startswith("refused: 'alias/pre-commit' is a git hook"), said
        assert hook.read_text() == PERSON
    finally:
        _run("umount", str(workspace / "alias"))


def test_a_head_written_by_another_case_beside_objects_and_refs_is_refused(
    folding: Path,
) -> None:
    # (git looks up `HEAD`, which on exFAT is the `head` written: `src/` became a git
    # directory to a person's git, its `config` one the agent wrote before)
    workspace = folding / "ws"
    for directory in ("src/Objects", "src/REFS"):
        (workspace / directory).mkdir(parents=True)
    said = _call(WRITE_FILE, workspace, {"path": "src/head", "content": "ref: refs/heads/main\n"})
    assert said.startswith("refused: 'src/head' is git metadata"), said
    assert not (workspace / "src" / "HEAD").exists()
    # what it would have been: a git directory to git
    (workspace / "src" / "head").write_text("ref: refs/heads/main\n")
    assert _git(workspace / "src", "rev-parse", "--git-dir").strip() == "."
