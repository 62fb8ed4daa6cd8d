"""Red-team of the disk checks cr2 added (dispatcher/policy/git_links.py), helper rt3a: a
word reaching `.git` through a link of a process in /proc (resolved here, it is the web
process's directory; run, the command's), an attached value past the sixteenth position
of an option cluster, and command lines crafted to make resolving their words take
minutes in the web process. Each is decided as admission decides it and, where it claims
an effect, run for real in the bubblewrap sandbox (see test_command_reader_cr.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.redteam.test_command_reader_cr import FSMONITOR_EDIT, decide, run
from tests.redteam.test_command_reader_cr2 import linked_workspace


@pytest.fixture
def workspace(sandboxed_workspace: Path) -> Path:
    return linked_workspace(sandboxed_workspace)  # `meta` a link to .git


# --- /proc: a process's directory is not the web process's ----------------------------------------
# `/proc/self/cwd` resolved when deciding is the web process's directory, outside the
# workspace (left to the sandbox); run, it is the command's, the workspace: `meta/config`
# through it is .git/config, whose core.fsmonitor the next `git status` runs.


@pytest.mark.parametrize(
    "path",
    [
        "/proc/self/cwd/meta/config",
        "/proc/thread-self/cwd/meta/config",
        "/dev/fd/../../self/cwd/meta/config",
    ],
)
def test_a_word_through_a_process_link_in_proc_is_not_allowed(workspace: Path, path: str) -> None:
    argv = ["sed", "-i", FSMONITOR_EDIT, path]
    assert decide(workspace, argv, ["sed *"]) == "ask"
    run(workspace, argv)  # the premise, in the real sandbox
    run(workspace, ["git", "status"])
    assert (workspace / "fsmonitor-ran").exists()


def test_proc_and_dev_words_that_traverse_no_process_link_still_read(workspace: Path) -> None:
    assert decide(workspace, ["cat", "/proc/self/status"], ["cat *"]) == "allow"
    assert decide(workspace, ["tee", "/dev/stderr"], ["tee *"]) == "allow"
    assert decide(workspace, ["cat", "/proc/self/cwd/src/a.py"], ["cat *"]) == "ask"


# --- an attached value anywhere in a cluster -------------------------------------------------------
# Attached values were looked for at the first sixteen positions of a `-abc` word only; cp
# takes `-t DIR` after any number of flags, so twenty `-v` hid `-tmeta/hooks`.


def test_an_attached_value_past_sixteen_flags_is_resolved(workspace: Path) -> None:
    (workspace / "pre-commit").write_text("#!/bin/sh\ntouch hook-ran\n")
    argv = ["cp", "-" + "v" * 20 + "tmeta/hooks", "pre-commit"]
    assert decide(workspace, argv, ["cp *"]) == "ask"
    assert decide(workspace, ["cp", "-" + "v" * 20 + "tsrc", "pre-commit"], ["cp *"]) == "allow"
    run(workspace, argv)  # the premise: the hook is in place
    assert (workspace / ".git" / "hooks" / "pre-commit").exists()


# --- loops and cost: fail closed, quickly ----------------------------------------------------------


def test_a_link_loop_is_unreadable(workspace: Path) -> None:
    (workspace / "loop1").symlink_to("loop2/x")
    (workspace / "loop2").symlink_to("loop1/x")
    assert decide(workspace, ["sed", "-i", "s/a/b/", "loop1/config"], ["sed *"]) == "ask"


@pytest.mark.parametrize(
    "argv",
    [
        # resolving each word component by component took 25 s (a link `l` to `.`)
        ["sh", "-c", "cd a && cd a && cd a && cat " + " ".join(["-" + "l/" * 480] * 28)],
        # and 150 s with a plain directory: MAX_CHECKS bounded resolutions, not their cost
        ["cat", *(["-" + "a/" * 2000] * 250)],
        ["cat", "-" + "v" * 200_000],  # a cluster with a value at any of its positions
    ],
    ids=["links", "directories", "cluster"],
)
def test_a_command_crafted_to_be_slow_to_resolve_is_decided_quickly(
    workspace: Path, argv: list[str]
) -> None:
    (workspace / "a").mkdir()
    (workspace / "l").symlink_to(".")
    # (this thread's CPU time, not the wall clock's: a loaded host's other work is not in
    # it, and resolving a path is this thread's own work, its system calls included)
    started = time.thread_time()
    assert decide(workspace, argv, ["cat *", "cd *"]) == "ask"
    assert time.thread_time() - started < 3  # in the web process; before: 25 s to minutes


# --- a shell's cd is logical ----------------------------------------------------------------------
# bash and dash take `..` in `cd` lexically: from `a`, `cd l/../..` (`l` a link to `x/y/z`)
# is the workspace, where `meta/config` is .git/config; resolved with links followed it was
# `a/x`, where `meta` is nothing.


def test_a_cd_through_a_link_and_dot_dot_is_read_as_the_shell_takes_it(workspace: Path) -> None:
    (workspace / "a" / "x" / "y" / "z").mkdir(parents=True)
    (workspace / "a" / "l").symlink_to("x/y/z")
    argv = ["bash", "-c", f"cd l/../.. && sed -i '{FSMONITOR_EDIT}' meta/config"]
    assert decide(workspace, argv, ["cd *", "sed *"], cwd="a") == "ask"
    plain = ["bash", "-c", "cd l/../.. && sed -i s/a/b/ src/a.py"]
    assert decide(workspace, plain, ["cd *", "sed *"], cwd="a") == "allow"
    run(workspace, argv, cwd="a")  # the premise, in the real sandbox
    run(workspace, ["git", "status"])
    assert (workspace / "fsmonitor-ran").exists()


# --- kept verdicts: bounded in size, not only in number --------------------------------------------


def test_verdicts_kept_for_long_commands_hold_no_request_sized_keys(workspace: Path) -> None:
    from dispatcher.policy import rules

    rules._VERDICTS.clear()
    for n in range(20):  # distinct calls of 200 kB each, every one decided
        argv = ["cat", f"f{n}", "src/" + "b" * 200_000]
        assert decide(workspace, argv, ["cat *"]) == "allow"
    kept = sum(len(key[2]) for key in rules._VERDICTS)
    assert kept < 20 * rules.MAX_KEPT_ARGUMENTS  # before: 4 MB, and 4096 of them were kept
    assert decide(workspace, ["cat", "src/a.py"], ["cat *"]) == "allow"
