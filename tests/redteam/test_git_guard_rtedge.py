"""Red team (rtedge) of the git metadata guard's fixes of rt13 (dispatcher/tools/
sandbox_git.py): where the guard and a person's git still read a submodule's git
directory differently. Real bwrap, real git; a person's host git run proves each plant
(a marker file a hook makes)."""

from __future__ import annotations

import os
import shutil
import struct
import time
from pathlib import Path

import pytest

from dispatcher.tools import sandbox
from tests.redteam.test_git_metadata_guard import agent_in_sandbox, host_git, repository
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_git_metadata_guard_rt12 import EMPTY_BLOB, G
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


def evil_git_directory(workspace: Path, tmp_path: Path, object_format: str = "sha1") -> str:
    """A hand-built git directory at `workspace/evilgit` whose post-checkout hook makes
    `workspace/hook-ran`; its commit's id."""
    source = tmp_path / "src"
    source.mkdir()
    host_git(source, "init", "-q", "-b", "main", f"--object-format={object_format}")
    (source / "f").write_text("x\n")
    host_git(source, *G, "add", "f")
    host_git(source, *G, "commit", "-qm", "evil")
    commit = host_git(source, "rev-parse", "HEAD").strip()
    shutil.copytree(source / ".git", workspace / "evilgit", symlinks=True)
    hook = workspace / "evilgit" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {workspace / 'hook-ran'}\n")
    hook.chmod(0o755)
    return commit


def test_a_head_git_reads_no_refs_in_keeps_the_submodule_a_git_directory(
    agent_in_sandbox: AgentFixture, tmp_path: Path
) -> None:
    """The guard read 256 bytes of `.git/modules/x/HEAD` to tell whether git reads it as
    a git directory's; git reads 255 (validate_headref). An unapproved command wrote
    `ref:`, 247 spaces and `refs/heads/main` there (the guard saw `refs/`, git only
    `refs`) and linked a hand-built git directory of the workspace at `x/objects/evil`:
    x was no git directory for git, nothing refused a submodule's git directory inside
    it, and the person's `git submodule update --init` ran its post-checkout hook as
    root, outside the sandbox."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    host_git(workspace, *G, "commit", "--allow-empty", "-qm", "base")
    sub = workspace / "x"
    sub.mkdir()
    host_git(sub, "init", "-q", "-b", "main")
    (sub / "f").write_text("base\n")
    host_git(sub, *G, "add", "f")
    host_git(sub, *G, "commit", "-qm", "base")
    host_git(workspace, *G, "submodule", "add", "-q", "./x", "x")
    host_git(workspace, *G, "submodule", "absorbgitdirs")
    host_git(workspace, *G, "commit", "-qm", "with x")
    assert (workspace / ".git" / "modules" / "x" / "HEAD").is_file()
    commit = evil_git_directory(workspace, tmp_path)
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    name = "x/objects/evil"
    script = (
        "printf 'ref:%247srefs/heads/main\\n' '' > .git/modules/x/HEAD"
        f" && ln -s {workspace}/evilgit .git/modules/{name}"
        f" && git config -f .gitmodules submodule.{name}.path evil"
        f" && git config -f .gitmodules submodule.{name}.url ./evil"
        f" && git update-index --add --cacheinfo 160000,{commit},evil && echo done"
    )
    output = sandboxed(workspace, script)
    assert "done" in output, output
    person = host_git(workspace, *G, "submodule", "update", "--init")
    assert not (workspace / "hook-ran").exists(), (output, person)
    # HEAD is one git reads again: the submodule's git directory refuses one inside it
    assert "removed or replaced HEAD of the git directory '.git/modules/x'" in output, output
    assert host_git(workspace / "x", "symbolic-ref", "HEAD").strip() == "refs/heads/main"


def test_a_sha1_id_in_a_submodules_submodule_keeps_it_a_git_directory_in_sha256(
    agent_in_sandbox: AgentFixture, tmp_path: Path
) -> None:
    """The guard read every HEAD under `.git/modules/` in the superproject's object
    format; git reads a nested submodule's (`.git/modules/x/modules/y`) in its own
    superproject's, x's. With x in sha256 under a sha1 workspace, an unapproved command
    wrote 40 hex digits to y's HEAD (a git directory's to the guard, none to x's git) and
    linked a hand-built git directory of the workspace at `y/objects/evil`: the person's
    `git submodule update --init` in x ran its post-checkout hook as root."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    host_git(workspace, *G, "commit", "--allow-empty", "-qm", "base")
    sub = workspace / "x"
    for where in (sub / "y", sub):
        where.mkdir(parents=True, exist_ok=True)
        if not (where / ".git").exists():
            host_git(where, "init", "-q", "-b", "main", "--object-format=sha256")
        (where / "f").write_text("base\n")
        host_git(where, *G, "add", "f")
        host_git(where, *G, "commit", "-qm", "base")
    host_git(sub, *G, "submodule", "add", "-q", "./y", "y")
    host_git(sub, *G, "submodule", "absorbgitdirs")
    host_git(sub, *G, "commit", "-qm", "with y")
    # x's git directory moved into the workspace's, as absorbgitdirs would have it
    modules = workspace / ".git" / "modules"
    modules.mkdir()
    shutil.move(sub / ".git", modules / "x")
    (sub / ".git").write_text("gitdir: ../.git/modules/x\n")
    host_git(workspace, "config", "-f", ".git/modules/x/config", "core.worktree", "../../../x")
    (sub / "y" / ".git").write_text("gitdir: ../../.git/modules/x/modules/y\n")
    y_config = ".git/modules/x/modules/y/config"
    host_git(workspace, "config", "-f", y_config, "core.worktree", "../../../../../x/y")
    assert host_git(sub / "y", "symbolic-ref", "HEAD").strip() == "refs/heads/main"
    assert (modules / "x" / "modules" / "y" / "HEAD").is_file()
    commit = evil_git_directory(workspace, tmp_path, "sha256")
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    name = "y/objects/evil"
    short = host_git(sub / "y", "rev-parse", "HEAD").strip()[:40]
    script = (
        f"echo {short} > .git/modules/x/modules/y/HEAD"
        f" && ln -s {workspace}/evilgit .git/modules/x/modules/{name} && cd x"
        f" && git config -f .gitmodules submodule.{name}.path evil"
        f" && git config -f .gitmodules submodule.{name}.url ./evil"
        f" && git update-index --add --cacheinfo 160000,{commit},evil && echo done"
    )
    output = sandboxed(workspace, script)
    assert "done" in output, output
    person = host_git(sub, *G, "submodule", "update", "--init")
    assert not (workspace / "hook-ran").exists(), (output, person)
    assert "removed or replaced HEAD of the git directory '.git/modules/x/modules/y'" in output
    assert host_git(sub / "y", "symbolic-ref", "HEAD").strip() == "refs/heads/main"


def packed_index(path: Path, entries: int, length: int) -> None:
    """An index of version 4 (each path stored as what it keeps of the one before and
    what it adds) of `entries` paths of `length` bytes, each the empty blob: six bytes
    and a few on disk for each path, `length` of them in git's memory and its listing."""
    head = struct.pack(">10I", 0, 0, 0, 0, 0, 0, 0o100644, 0, 0, 0) + EMPTY_BLOB
    head += struct.pack(">H", 0xFFF)  # (a long path: its length is where its NUL is)
    with path.open("wb") as out:
        out.write(b"DIRC" + struct.pack(">II", 4, entries))
        out.write(head + b"\0" + b"a" * (length - 6) + b"%06x\0" % 0)
        out.write(b"".join(head + b"\x06%06x\0" % i for i in range(1, entries)))
        out.write(b"\0" * 20)


def test_a_packed_index_is_bounded_by_what_git_makes_of_it(
    agent_in_sandbox: AgentFixture,
) -> None:
    """The bound on the index git reads after a run counted its bytes on disk; a
    version 4 index stores each path as what it keeps of the one before, and git makes
    all of them whole in memory, then lists them: an unapproved `cp` of 2 MiB crafted so
    had git on the host take 1 GiB of memory and hand the worker a listing of 1 GiB (and
    64 MiB of it, within the bound, 30 GiB). It counts the paths git makes now: past the
    bound, it is removed unread."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    host_git(workspace, *G, "commit", "--allow-empty", "-qm", "base")
    packed_index(workspace / "crafted", 30_000, 32 << 10)
    assert (workspace / "crafted").stat().st_size < 3 << 20
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    started = time.monotonic()
    output = sandboxed(workspace, "cp crafted .git/index && echo done")
    took = time.monotonic() - started
    assert output.startswith("exit code 0\ndone"), output
    assert not (workspace / ".git" / "index").exists(), output
    assert "left the git index '.git/index' at 64 MiB" in output, output
    assert "removed unread" in output, output
    assert took < 30, took
    host_git(workspace, "reset", "-q")
    assert "base" in host_git(workspace, "log", "--format=%s")
