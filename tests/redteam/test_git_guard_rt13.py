"""Red team (rt13) of the git metadata guard's reads after a run (dispatcher/tools/
sandbox_git.py): what a command no person approved leaves for the worker to read. Real
bwrap, real git."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from dispatcher.tools import sandbox
from dispatcher.tools.base import ToolError
from tests.redteam.test_git_metadata_guard import agent_in_sandbox, host_git, repository
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_git_metadata_guard_rt12 import G, large_index
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


def released_after(path: Path, seconds: float) -> threading.Event:
    """Open the FIFO at `path` for writing after `seconds` (a reader blocked on it goes
    on), unless the returned event is set first: the test ends either way."""
    done = threading.Event()

    def release() -> None:
        if done.wait(seconds):
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            return
        os.close(fd)

    threading.Thread(target=release, daemon=True).start()
    return done


@pytest.mark.parametrize("name", ["index", "sharedindex." + "ab" * 20])
def test_a_fifo_index_does_not_hold_the_worker(agent_in_sandbox: AgentFixture, name: str) -> None:
    """`.git/index` is writable for an unapproved command (git add), and the guard reads
    an index the run changed: opened without O_NONBLOCK, a FIFO there (or a split
    index's shared part beside it) held the worker forever, in the workspace's lock,
    with nothing left in the sandbox to write it."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    host_git(workspace, "commit", "--allow-empty", "-qm", "base")
    sandbox.give_to_sandbox(workspace)
    planted = workspace / ".git" / name
    done = released_after(planted, 15)
    started = time.monotonic()
    script = f"rm -f .git/{name} && mkfifo .git/{name} && echo done"
    output = sandboxed(workspace, script)
    took = time.monotonic() - started
    done.set()
    assert took < 10, (took, output)
    assert output.startswith("exit code 0\ndone"), output
    assert "it was removed" in output, output
    assert not (workspace / ".git" / "index").is_fifo()
    # and the person's git goes on (an index git makes again names no planted part)
    host_git(workspace, "reset", "-q")
    assert "base" in host_git(workspace, "log", "--format=%s")
    host_git(workspace, "status")


# --- the bound on what git reads of indexes after a run ----------------------------------


def test_many_large_indexes_in_one_run_are_not_all_read(agent_in_sandbox: AgentFixture) -> None:
    """The bound was each index's own (64 MiB, or twice its size before): one run made
    any number of repositories (`git init`, a link to one crafted index of 40 MiB in
    each), and the worker had git read every one after it, 40 MiB after 40 MiB, a few
    thousand in a 60 s run. The bytes of index git reads after a run are bounded
    together now: past it, a made repository goes unread."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    host_git(workspace, "commit", "--allow-empty", "-qm", "base")
    large_index(workspace / "crafted", 580_000)  # 40 MiB
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    script = (
        "for i in 1 2 3 4 5 6; do git init -q r$i && ln -f crafted r$i/.git/index; done"
        " && echo done"
    )
    output = sandboxed(workspace, script)
    assert output.startswith("exit code 0\ndone"), output
    kept = [i for i in range(1, 7) if (workspace / f"r{i}" / ".git").exists()]
    assert len(kept) <= 1, (kept, output)
    assert output.count("not read") >= 5, output
    assert "base" in host_git(workspace, "log", "--format=%s")


def test_an_index_grown_run_after_run_stops_unapproved_runs(
    agent_in_sandbox: AgentFixture,
) -> None:
    """The bound of a run was twice the index it found: each unapproved run could double
    it (60 MiB, 120, 240 ... up to the sandbox's 1 GiB file cap), and the run after read
    it all again for a `touch .git/index`. An index (all the workspace's guarded ones
    together) larger than 64 MiB before a run now lets no unapproved command run."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    host_git(workspace, "commit", "--allow-empty", "-qm", "base")
    large_index(workspace / "i60", 870_000)  # 60 MiB
    large_index(workspace / "i120", 1_740_000)  # 120 MiB
    large_index(workspace / "i240", 3_480_000)  # 240 MiB
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    grown: list[str] = []
    for name in ("i60", "i120", "i240"):
        try:
            grown.append(sandboxed(workspace, f"cp {name} .git/index && echo done"))
        except ToolError as error:
            grown.append(str(error))
    assert grown[0].startswith("exit code 0\ndone") and "[harness:" not in grown[0]
    assert grown[1].startswith("exit code 0\ndone") and "[harness:" not in grown[1]
    assert "nothing ran" in grown[2] and "64 MiB" in grown[2], grown[2]
    assert (workspace / ".git" / "index").stat().st_size < 200 << 20


# --- a submodule's git directory that git no longer reads as one --------------------------


def test_a_short_object_id_in_a_sha256_submodules_head_keeps_it_a_git_directory(
    agent_in_sandbox: AgentFixture, tmp_path: Path
) -> None:
    """The guard read `.git/modules/x/HEAD` as a git directory's when it held 40 hex
    digits; git reads it with the superproject's object format, whose ids are 64 digits
    in a sha256 repository. An unapproved command wrote 40 there and linked a hand-built
    git directory of the workspace (a post-checkout hook) at `x/objects/evil` (the walk
    for planted ones follows no link): x was no git directory for git, so nothing refused
    a submodule's git directory inside it, and the person's `git submodule update --init`
    ran the hook, as root, outside the sandbox."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    shutil.rmtree(workspace / ".git")
    host_git(workspace, "init", "-q", "-b", "main", "--object-format=sha256")
    host_git(workspace, *G, "commit", "--allow-empty", "-qm", "base")
    sub = workspace / "x"
    sub.mkdir()
    host_git(sub, "init", "-q", "-b", "main", "--object-format=sha256")
    (sub / "f").write_text("base\n")
    host_git(sub, *G, "add", "f")
    host_git(sub, *G, "commit", "-qm", "base")
    host_git(workspace, *G, "submodule", "add", "-q", "./x", "x")
    host_git(workspace, *G, "submodule", "absorbgitdirs")
    host_git(workspace, *G, "commit", "-qm", "with x")
    assert (workspace / ".git" / "modules" / "x" / "HEAD").is_file()
    source = tmp_path / "src"
    source.mkdir()
    host_git(source, "init", "-q", "-b", "main", "--object-format=sha256")
    (source / "f").write_text("x\n")
    host_git(source, *G, "add", "f")
    host_git(source, *G, "commit", "-qm", "evil")
    commit = host_git(source, "rev-parse", "HEAD").strip()
    shutil.copytree(source / ".git", workspace / "evilgit", symlinks=True)
    mark = workspace / "hook-ran"
    hook = workspace / "evilgit" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {mark}\n")
    hook.chmod(0o755)
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    name = "x/objects/evil"
    short = host_git(workspace / "x", "rev-parse", "HEAD").strip()[:40]
    script = (
        f"echo {short} > .git/modules/x/HEAD && ln -s {workspace}/evilgit .git/modules/{name}"
        f" && git config -f .gitmodules submodule.{name}.path evil"
        f" && git config -f .gitmodules submodule.{name}.url ./evil"
        f" && git update-index --add --cacheinfo 160000,{commit},evil && echo done"
    )
    output = sandboxed(workspace, script)
    assert "done" in output, output
    person = host_git(workspace, *G, "submodule", "update", "--init")
    assert not mark.exists(), (output, person)
    # HEAD is one git reads again: the submodule's git directory refuses one inside it
    assert "removed or replaced HEAD of the git directory '.git/modules/x'" in output, output
    assert host_git(workspace / "x", "rev-parse", "HEAD").strip()[:40] == short
