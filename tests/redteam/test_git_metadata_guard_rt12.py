"""Red team (rt12) of the git metadata guard (dispatcher/tools/sandbox_git.py): what a
command no person approved leaves in a git directory for the worker, or a person's git on
the host, to read or run afterwards. Real bwrap, real git."""

from __future__ import annotations

import os
import resource
import shutil
import struct
import time
from pathlib import Path

import pytest

from dispatcher.tools import sandbox, sandbox_git
from dispatcher.tools.base import ToolError
from tests.redteam.test_git_metadata_guard import agent_in_sandbox, host_git, repository
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name

EMPTY_BLOB = bytes.fromhex("e69de29bb2d1d6434b8b29ae775a72ea2f7f0acb")


def cpu_seconds() -> float:
    """This thread's CPU time and that of every child process waited for (the sandbox's
    programs and git's): a loaded host's other work is in neither, unlike the wall clock."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.thread_time() + children.ru_utime + children.ru_stime


def large_index(path: Path, entries: int) -> None:
    """A valid index (version 2) of `entries` sorted, harmless names (`00000000` ...),
    each the empty blob: git reads every entry (its checksum is not verified on read)."""
    head = struct.pack(">10I", 0, 0, 0, 0, 0, 0, 0o100644, 0, 0, 0) + EMPTY_BLOB
    head += struct.pack(">H", 8)
    with path.open("wb") as out:
        out.write(b"DIRC" + struct.pack(">II", 2, entries))
        for start in range(0, entries, 100_000):
            stop = min(start + 100_000, entries)
            out.write(b"".join(head + b"%08x\0\0" % i for i in range(start, stop)))
        out.write(b"\0" * 20)


def test_a_very_large_index_is_removed_unread(agent_in_sandbox: AgentFixture) -> None:
    """A crafted index of 4,000,000 entries (288 MB; the sandbox lets a file grow to
    1 GiB): git read it after the run, twice (its entries, its resolve-undo record), each
    with 120 s allowed, holding the worker all that time and its listing in memory. An
    index the run grew past 64 MiB (or twice what there was) is removed unread now."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    host_git(workspace, "commit", "--allow-empty", "-qm", "base")
    large_index(workspace / "crafted", 4_000_000)
    os.chown(workspace, 0, 0)  # given again, with what the person's git made
    sandbox.give_to_sandbox(workspace)
    started, began = time.monotonic(), cpu_seconds()
    output = sandboxed(workspace, "cp crafted .git/index && echo done")
    took, cpu = time.monotonic() - started, cpu_seconds() - began
    print(f"wall {took:.2f} s, CPU {cpu:.2f} s")
    assert output.startswith("exit code 0\ndone"), output
    assert not (workspace / ".git" / "index").exists()
    assert "left the git index '.git/index' at 274 MiB" in output, output
    assert "removed unread" in output and "`git reset`" in output
    # The copy itself takes a moment (0.07 s of CPU here); git's readings of the index took
    # 7.7 s of CPU (19 s of the wall clock at load 7): counted in CPU, not wall time, which
    # a loaded host's copy of 288 MB may stretch past a few seconds by itself.
    assert cpu < 0.5, (cpu, took)
    # and the person's repository works as before
    assert "base" in host_git(workspace, "log", "--format=%s")


def test_a_large_split_index_part_is_removed_with_it(agent_in_sandbox: AgentFixture) -> None:
    """The same through a split index's shared part (`sharedindex.*`, which git reads
    with the index that names it): planted beside an index left as it was, it counted
    for nothing, and a later run's index naming it had git read it all."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    host_git(workspace, "commit", "--allow-empty", "-qm", "base")
    large_index(workspace / "crafted", 1_500_000)
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    name = "sharedindex." + "ab" * 20
    output = sandboxed(workspace, f"cp crafted .git/{name} && echo done")
    assert output.startswith("exit code 0\ndone"), output
    assert not (workspace / ".git" / name).exists()
    assert "removed unread" in output, output


def test_an_index_within_the_limit_is_read_and_kept(agent_in_sandbox: AgentFixture) -> None:
    """Below the limit the index is read as before: `git add` of many files stays."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    for i in range(200):
        (workspace / f"f{i}.txt").write_text(f"{i}\n")
    sandbox.give_to_sandbox(workspace)
    output = sandboxed(workspace, "git add . && echo done")
    assert output.startswith("exit code 0\ndone") and "[harness:" not in output, output
    assert len(host_git(workspace, "ls-files").split()) == 200
    assert sandbox_git.index_limit(0) == 64 << 20
    assert sandbox_git.index_limit(100 << 20) == (200 << 20) + (1 << 20)


def test_a_very_large_index_of_a_repository_the_command_made_goes_with_it(
    agent_in_sandbox: AgentFixture,
) -> None:
    """A `.git` the command made is judged after it, its index read by git too: the
    same crafted index there held the worker as long."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    large_index(workspace / "crafted", 2_000_000)
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    started, began = time.monotonic(), cpu_seconds()
    output = sandboxed(workspace, "git init -q sub && cp crafted sub/.git/index && echo done")
    took, cpu = time.monotonic() - started, cpu_seconds() - began
    print(f"wall {took:.2f} s, CPU {cpu:.2f} s")
    assert output.startswith("exit code 0\ndone"), output
    assert not (workspace / "sub" / ".git").exists()
    assert "holds an index larger than 64 MiB, not read" in output, output
    assert cpu < 0.5, (cpu, took)  # (git's readings of 2,000,000 entries: 3.9 s of CPU)


# --- a hand-built git directory inside a submodule's ------------------------------------

G = ["-c", "user.email=a@b", "-c", "user.name=A", "-c", "protocol.file.allow=always"]


def evil_git_dir(workspace: Path, source: Path, mark: Path) -> str:
    """In the workspace (the agent writes its files): `evilgit/`, a non-bare repository's
    git directory with one commit and a post-checkout hook that touches `mark`, built from
    `source` outside it. Returns the commit's id."""
    source.mkdir()
    host_git(source, "init", "-q", "-b", "main")
    (source / "f").write_text("x\n")
    host_git(source, *G, "add", "f")
    host_git(source, *G, "commit", "-qm", "evil")
    commit = host_git(source, "rev-parse", "HEAD").strip()
    shutil.copytree(source / ".git", workspace / "evilgit", symlinks=True)
    hook = workspace / "evilgit" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {mark}\n")
    hook.chmod(0o755)
    return commit


SPOIL = {
    "HEAD removed": "rm .git/modules/x/HEAD",
    "HEAD not git's": "echo junk > .git/modules/x/HEAD",
    "refs removed": "rm -rf .git/modules/x/refs",
    "left whole": "true",
}


@pytest.mark.parametrize("spoil", sorted(SPOIL))
def test_a_git_directory_hand_built_in_a_submodules_objects_runs_nothing(
    agent_in_sandbox: AgentFixture, tmp_path: Path, spoil: str
) -> None:
    """`.git/modules/x` holds HEAD, so its `objects/` was taken as its own and left
    writable, unjudged. An unapproved command copied a hand-built git directory (a
    post-checkout hook) to `.git/modules/x/objects/evil`, named it a submodule
    (`.gitmodules`, a gitlink in the index) and removed `.git/modules/x/HEAD`: git refuses
    a submodule's git directory inside another's only while that other is a git directory,
    so the person's `git submodule update --init` took the hand-built one and ran its
    hook, as root, outside the sandbox."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    host_git(workspace, *G, "commit", "--allow-empty", "-qm", "base")
    submodule(workspace, "x")
    host_git(workspace, *G, "commit", "-qm", "with x")
    mark = workspace / "hook-ran"
    commit = evil_git_dir(workspace, tmp_path / "src", mark)
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    name = "x/objects/evil"
    script = (
        # (`evilgit/` is a git directory to git, guarded as one: its HEAD goes instead)
        f"cp -r evilgit .git/modules/{name} && rm evilgit/HEAD && {SPOIL[spoil]} && "
        f"git config -f .gitmodules submodule.{name}.path evil && "
        f"git config -f .gitmodules submodule.{name}.url ./evil && "
        f"git update-index --add --cacheinfo 160000,{commit},evil && echo done"
    )
    output = sandboxed(workspace, script)
    assert "done" in output, output
    person = host_git(workspace, *G, "submodule", "update", "--init")
    if (workspace / "evil").is_dir():
        host_git(workspace / "evil", "status")
    assert not mark.exists(), (output, person)
    assert not (workspace / ".git" / "modules" / name).exists()
    assert f"left '.git/modules/{name}', which git would take" in output, output
    # the submodule's git directory is one still, so git refuses one nested in it
    assert (workspace / ".git" / "modules" / "x" / "HEAD").is_file(), output
    assert (workspace / ".git" / "modules" / "x" / "refs").is_dir(), output
    what = {"refs removed": "refs/", "left whole": None}.get(spoil, "HEAD")
    if what is not None:
        assert f"removed or replaced {what} of the git directory '.git/modules/x'" in output
    assert "main" in host_git(workspace / "x", "branch", "--show-current")
    # and the submodule works for the next unapproved command as before
    again = sandboxed(
        workspace,
        "git -C x -c user.email=a@b -c user.name=A commit -q --allow-empty -m again && echo ok",
    )
    assert again.startswith("exit code 0\nok"), again


def test_a_relative_hooks_path_from_a_work_tree_set_elsewhere_is_guarded(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`core.worktree = ../a/b` with `core.hooksPath = ../../hooks`: git runs hooks from
    the work tree `a/b/`, so from the workspace's `hooks/`; the guard placed the path from
    the `.git`'s parent (`hooks/` two levels above the workspace, outside), bound nothing,
    and an allowed copy planted `pre-commit` that the person's commit ran."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    (workspace / "a" / "b").mkdir(parents=True)
    host_git(workspace, "config", "core.worktree", "../a/b")
    host_git(workspace, "config", "core.hooksPath", "../../hooks")
    mark = workspace / "hook-ran"
    (workspace / "evil.sh").write_text(f"#!/bin/sh\ntouch {mark}\n")
    (workspace / "evil.sh").chmod(0o755)
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    try:
        output = sandboxed(workspace, "mkdir -p hooks && cp evil.sh hooks/pre-commit")
    except ToolError as error:
        output = str(error)
    host_git(workspace / "a" / "b", *G, "commit", "--allow-empty", "-qm", "person")
    assert not mark.exists(), output
    assert "core.worktree" in output and "nothing ran" in output, output
    assert not (workspace / "hooks").exists()


def submodule(workspace: Path, name: str) -> Path:
    """A submodule at `name` (named so), its git directory absorbed: `.git/modules/NAME`."""
    path = workspace / name
    path.mkdir()
    host_git(path, "init", "-q", "-b", "main")
    (path / "f").write_text("base\n")
    host_git(path, *G, "add", "f")
    host_git(path, *G, "commit", "-qm", "base")
    host_git(workspace, *G, "submodule", "add", "-q", f"./{name}", name)
    host_git(workspace, *G, "submodule", "absorbgitdirs")
    assert (workspace / ".git" / "modules" / name / "HEAD").exists()
    return path
