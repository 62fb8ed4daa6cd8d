"""Red-team of the command reader (helper cr): command lines an allow rule a user would
plausibly write lets run without asking, which in fact run another program or write a
file the reader keeps allow rules away from. Each attack is checked twice: the decision
(through the waterfall and the guards, as admission decides) and the effect, run for real
in the bubblewrap sandbox as run_command runs it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dispatcher.policy.context import CallContext, Profile
from dispatcher.policy.waterfall import permission_mode, run_guards, run_waterfall, user_rules
from dispatcher.tools.base import ExecutionContext
from dispatcher.tools.run_command import TOOL as RUN_COMMAND


@pytest.fixture
def workspace(sandboxed_workspace: Path) -> Path:
    return sandboxed_workspace


def decide(workspace: Path, argv: list[str], allow: list[str], cwd: str = ".") -> str:
    """allow / ask / deny for a run_command call, as admission decides (waterfall, guards)."""
    call = CallContext(
        call_id="t",
        session_id="s",
        tool=RUN_COMMAND,
        name=RUN_COMMAND.name,
        arguments={"argv": argv, "cwd": cwd},
        workspace=workspace,
        mode="standard",
        username="u",
        agent_name="a",
        profile=Profile(
            mode="standard", allow=tuple(f"run_command({r})" for r in allow), ask=(), deny=()
        ),
    )
    action = run_waterfall(call, [user_rules, permission_mode]).action
    return "deny" if action == "allow" and run_guards(call) else action


def run(workspace: Path, argv: list[str], cwd: str = ".") -> str:
    """run_command as the worker runs it: its environment, its sandbox, as a reviewer
    approved it (the premises show what the command itself does; one no person approved
    finds the git metadata read-only besides: tests/redteam/test_git_metadata_guard.py)."""
    ctx = ExecutionContext(
        workspace=workspace, call_id="cr", timeout=30, output_limit=20_000, git_guard="none"
    )
    return str(RUN_COMMAND.execute(ctx, {"argv": argv, "cwd": cwd}))


def git_init(workspace: Path) -> None:
    subprocess.run(["git", "init", "-q", str(workspace)], check=True, timeout=30)


# --- find: a `+` that does not follow `{}` is an argument, not the end of the command -----------
# GNU find ends `-exec CMD ... +` only at a `+` right after `{}`; the reader ended CMD at any
# `+`, so `find . -exec make test + --eval=X ;` read as `make test` (allowed by
# `run_command(make test)`) while find ran `make test + --eval=X`, and make ran X.

FIND_MAKE = ["find", ".", "-maxdepth", "0", "-exec", "make", "test", "+"]


def test_find_exec_plus_not_after_braces_is_not_read_as_its_end(workspace: Path) -> None:
    (workspace / "Makefile").write_text("test:\n\t@echo tests\n")
    argv = [*FIND_MAKE, "--eval=$(shell touch pwned)", ";"]
    run(workspace, argv)
    assert (workspace / "pwned").exists()  # the premise: find ran make with --eval
    assert decide(workspace, argv, ["find *", "make test"]) == "ask"
    assert decide(workspace, ["find", ".", "-exec", "cat", "+", "-n", ";"], ["find *", "cat"]) == (
        "ask"
    )
    # the forms find reads the same everywhere still read
    for ending in (["{}", "+"], ["{}", ";"], [";"]):
        argv = ["find", ".", "-name", "x", "-exec", "wc", "-l", *ending]
        assert decide(workspace, argv, ["find *", "wc *"]) == "allow", ending


@pytest.mark.parametrize(
    "argv",
    [
        ["find", ".", "-exec", "env", "-u", "+", "sudo", "id", ";"],
        ["find", ".", "-exec", "env", "-u", "+", "git", "push", ";"],
        ["gfind", ".", "-exec", "sudo", "id", ";"],
    ],
)
def test_the_guard_reads_find_exec_to_its_real_end(workspace: Path, argv: list[str]) -> None:
    assert decide_trusted(workspace, argv, deny=[]) == "deny"


def test_deny_rules_read_find_exec_to_its_real_end(workspace: Path) -> None:
    argv = ["find", ".", "-exec", "env", "-u", "+", "rm", "-rf", "src", ";"]
    assert decide_trusted(workspace, argv, deny=["rm *"]) == "deny"


def decide_trusted(workspace: Path, argv: list[str], deny: list[str]) -> str:
    call = CallContext(
        call_id="t",
        session_id="s",
        tool=RUN_COMMAND,
        name=RUN_COMMAND.name,
        arguments={"argv": argv},
        workspace=workspace,
        mode="trusted",
        username="u",
        agent_name="a",
        profile=Profile(
            mode="trusted", allow=(), ask=(), deny=tuple(f"run_command({r})" for r in deny)
        ),
    )
    action = run_waterfall(call, [user_rules, permission_mode]).action
    return "deny" if action == "allow" and run_guards(call) else action


# --- run in .git: plain names are git's control files ---------------------------------------------
# The reader keeps allow rules from writing `.git/config` and hooks by the words that name
# them; run_command's `cwd` was not read, so `sed -i ... config` in cwd `.git` (allowed by
# `run_command(sed *)`, whose `-i` is readable) wrote core.fsmonitor, which the next
# `git status` (sandboxed, or the developer's own) ran.

FSMONITOR_EDIT = "s/bare = false/bare = false\\n\\tfsmonitor = touch fsmonitor-ran/"


def test_a_command_run_in_the_git_directory_is_not_allowed_by_a_rule(workspace: Path) -> None:
    git_init(workspace)
    argv = ["sed", "-i", FSMONITOR_EDIT, "config"]
    assert decide(workspace, argv, ["sed *"], cwd=".git") == "ask"
    assert decide(workspace, ["cp", "x", "pre-commit"], ["cp *"], cwd=".git/hooks") == "ask"
    assert decide(workspace, ["cp", "x", "y"], ["cp *"], cwd="sub/../.git/./") == "ask"
    (workspace / "sub").mkdir()
    assert decide(workspace, argv, ["sed *"], cwd="sub") == "allow"  # elsewhere: as before
    run(workspace, argv, cwd=".git")  # the premise, in the real sandbox
    run(workspace, ["git", "status"])
    assert (workspace / "fsmonitor-ran").exists()


def test_a_link_to_the_git_directory_as_cwd_is_not_allowed_by_a_rule(workspace: Path) -> None:
    git_init(workspace)
    (workspace / "meta").symlink_to(".git")
    assert decide(workspace, ["sed", "-i", FSMONITOR_EDIT, "config"], ["sed *"], cwd="meta") == (
        "ask"
    )


# --- sort -o writes (or empties) the file it names -----------------------------------------------


def test_sort_output_is_not_allowed_by_a_sort_rule(workspace: Path) -> None:
    (workspace / "main.py").write_text("print('kept')\n")
    argv = ["sort", "-o", "main.py", "/dev/null"]
    for form in (argv, ["sort", "--out=main.py", "/dev/null"], ["sort", "-uomain.py", "x"]):
        assert decide(workspace, form, ["sort *"]) == "ask", form
    assert decide(workspace, ["sort", "-u", "main.py"], ["sort *"]) == "allow"
    run(workspace, argv)  # the premise: the file is emptied
    assert (workspace / "main.py").read_text() == ""


# --- dash reads `&>` as `&` and `>` ---------------------------------------------------------------
# `sh -c 'ls &>/dev/null rm -rf src'`: bash runs `ls rm -rf src` (output to /dev/null), dash
# (Debian's sh) runs `ls &` and then `rm -rf src`. Both readers read it as bash: the strict
# one allowed it by `run_command(ls *)`, the wide one showed no `rm` to deny rules nor
# `sudo` to the guard.


def test_sh_ampersand_redirect_is_not_allowed_by_a_rule(workspace: Path) -> None:
    (workspace / "src").mkdir()
    argv = ["sh", "-c", "ls &>/dev/null rm -rf src"]
    assert decide(workspace, argv, ["ls *"]) == "ask"
    assert decide(workspace, ["watch", "-n", "1", "ls &>/dev/null rm -rf src"], ["ls *"]) == "ask"
    assert decide(workspace, ["bash", "-c", "ls &>/dev/null"], ["ls *"]) == "allow"
    run(workspace, argv)  # the premise: dash removed src
    assert not (workspace / "src").exists()


@pytest.mark.parametrize(
    ("argv", "deny"),
    [
        (["sh", "-c", "true &>/dev/null rm -rf src"], ["rm *"]),
        (["dash", "-c", "true &>>/dev/null git push"], ["git push *"]),
        (["sh", "-c", "true &>/dev/null sudo id"], []),
        (["sh", "-c", "true &>/dev/null git push"], []),
    ],
)
def test_deny_rules_and_the_guard_read_sh_ampersand_redirect_as_dash(
    workspace: Path, argv: list[str], deny: list[str]
) -> None:
    assert decide_trusted(workspace, argv, deny) == "deny"


# --- diff3 and sdiff run the diff program they are given --------------------------------------------


@pytest.mark.parametrize("program", ["diff3", "sdiff"])
def test_diff_program_is_not_allowed_by_a_rule(workspace: Path, program: str) -> None:
    script = workspace / "x"
    script.write_text("#!/bin/sh\ntouch diff-program-ran\n")
    script.chmod(0o755)
    files = ["a", "b", "c"] if program == "diff3" else ["a", "b"]
    for name in files:
        (workspace / name).write_text(name + "\n")
    argv = [program, "--diff-prog=./x", *files]
    assert decide(workspace, argv, [f"{program} *"]) == "ask"
    assert decide(workspace, [program, *files], [f"{program} *"]) == "allow"
    run(workspace, argv)  # the premise: it ran ./x
    assert (workspace / "diff-program-ran").exists()


# --- names find chooses at run time ---------------------------------------------------------------
# `{}` and -execdir's directory are chosen at run time, as xargs's names are: the words the
# reader checks for `.git` never name what is written.


def test_find_exec_on_found_names_is_not_allowed_for_a_writer(workspace: Path) -> None:
    git_init(workspace)
    argv = ["find", ".", "-path", "*/.gi?/config", "-exec", "sed", "-i", FSMONITOR_EDIT, "{}", ";"]
    assert decide(workspace, argv, ["find *", "sed *"]) == "ask"
    hook = ["find", ".", "-name", "pre-commit.sample", "-execdir", "cp", "x", "pre-commit", ";"]
    assert decide(workspace, hook, ["find *", "cp *"]) == "ask"
    # programs that write no file they name still read on found names
    for program in (["wc", "-l"], ["grep", "-n", "x"], ["rm"]):
        found = ["find", ".", "-name", "*.pyc", "-exec", *program, "{}", "+"]
        assert decide(workspace, found, ["find *", f"{program[0]} *"]) == "allow", program
    run(workspace, argv)  # the premise, in the real sandbox
    run(workspace, ["git", "status"])
    assert (workspace / "fsmonitor-ran").exists()


# --- git apply --unsafe-paths writes into .git --------------------------------------------------

HOOK_PATCH = """diff --git a/.git/hooks/pre-commit b/.git/hooks/pre-commit
new file mode 100755
--- /dev/null
+++ b/.git/hooks/pre-commit
@@ -0,0 +1,2 @@
+#!/bin/sh
+touch hook-ran
"""


def test_git_apply_unsafe_paths_is_not_allowed_by_a_rule(workspace: Path) -> None:
    git_init(workspace)
    (workspace / "x.patch").write_text(HOOK_PATCH)
    for option in ("--unsafe-paths", "--unsafe", "--uns"):
        assert decide(workspace, ["git", "apply", option, "x.patch"], ["git apply *"]) == "ask"
    assert decide(workspace, ["git", "apply", "x.patch"], ["git apply *"]) == "allow"
    assert "invalid path" in run(workspace, ["git", "apply", "x.patch"])  # git refuses it
    run(workspace, ["git", "apply", "--unsafe-paths", "x.patch"])  # the premise: it writes
    assert (workspace / ".git/hooks/pre-commit").read_text().endswith("touch hook-ran\n")
