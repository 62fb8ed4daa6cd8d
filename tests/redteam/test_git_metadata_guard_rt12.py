"""Red team (rt12) of the git metadata guard (dispatcher/tools/sandbox_git.py): what a
command no person approved leaves in a git directory for the worker, or a person's git on
the host, to read or run afterwards. Real bwrap, real git."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import pytest

from dispatcher.tools import sandbox, sandbox_git
from tests.redteam.test_git_metadata_guard import agent_in_sandbox, host_git, repository
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name

EMPTY_BLOB = bytes.fromhex("e69de29bb2d1d6434b8b29ae775a72ea2f7f0acb")


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
    started = time.monotonic()
    output = sandboxed(workspace, "cp crafted .git/index && echo done")
    took = time.monotonic() - started
    assert output.startswith("exit code 0\ndone"), output
    assert not (workspace / ".git" / "index").exists()
    assert "left the git index '.git/index' at 274 MiB" in output, output
    assert "removed unread" in output and "`git reset`" in output
    # the copy itself takes a moment; git's two listings took several seconds more
    assert took < 5, took
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
    started = time.monotonic()
    output = sandboxed(workspace, "git init -q sub && cp crafted sub/.git/index && echo done")
    took = time.monotonic() - started
    assert output.startswith("exit code 0\ndone"), output
    assert not (workspace / "sub" / ".git").exists()
    assert "holds an index larger than 64 MiB, not read" in output, output
    assert took < 5, took
