"""The git-metadata guard (dispatcher.tools.sandbox_git) without needless refusals.

Common setups made every command no person approved (an `ls` a rule allows) wait for a
reviewer:

1. `core.sshCommand = ssh -i /home/u/.ssh/key`: an absolute path outside the workspace
   as an argument. Such a path now passes (resolved: not a link into the workspace, not
   under /proc or /dev); a relative one (`-i ./key`) or one in the workspace still
   refuses. `/proc/self/cwd/fsmon.sh` passed as a program outside the workspace, and the
   person's git (whose cwd is the work tree) ran the agent's copy there: now refused.
2. husky (`core.hooksPath = .husky/_`): the hooks directory inside the workspace is now
   bound read-only for the run, as `.git/hooks` is (by descriptor, each directory from the
   workspace down to it bound onto itself), and with husky 9's `_` its parent `.husky`,
   whose `pre-commit` the `_` scripts run. A directory that does not exist, or a link on
   the way, still refuses.

Real sandbox (bwrap), real worker, real host git."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from dispatcher import execution
from dispatcher.models import Status
from dispatcher.tools import sandbox, sandbox_git
from dispatcher.tools.base import ExecutionContext
from dispatcher.tools.run_command import TOOL as RUN_COMMAND
from tests.redteam.test_git_metadata_guard import (
    agent_in_sandbox,
    allow,
    host_git,
    repository,
    submit,
)
from tests.redteam.test_git_metadata_guard2 import plant_program
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name

REFUSED = "A reviewer must approve this command"


def run(fx: AgentFixture, session_id: str, call_id: str, argv: list[str]) -> str:
    """A call a rule allows (no person approved it), run by the worker; what the model reads."""
    call = submit(fx, session_id, call_id, argv)
    assert call.status == Status.QUEUED, (call.status, call.reason)
    assert call.decided_by.startswith("rule:allow:"), call.decided_by
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    return str(call.content)


def unapproved(workspace: Path, script: str) -> str:
    ctx = ExecutionContext(workspace=workspace, call_id="t", timeout=30, output_limit=20_000)
    return str(RUN_COMMAND.execute(ctx, {"argv": ["bash", "-c", script]}))


# 1. absolute paths outside the workspace


def test_an_ssh_command_with_a_key_outside_the_workspace_lets_allowed_commands_run(
    agent_in_sandbox: AgentFixture, tmp_path: Path
) -> None:
    fx = agent_in_sandbox
    allow(fx, "ls *")
    session_id, workspace = repository(fx)
    keys = tmp_path / "home" / ".ssh"
    keys.mkdir(parents=True)
    (keys / "id_ed25519").write_text("key\n")
    value = f"ssh -i {keys}/id_ed25519 -F /dev/null"
    host_git(workspace, "config", "core.sshCommand", value)
    (workspace / "a.txt").write_text("x\n")
    output = run(fx, session_id, "ls", ["ls", "-a"])
    assert output.startswith("exit code 0\n") and "a.txt" in output, output
    assert sandbox_git.unguardable(workspace) is None


@pytest.mark.parametrize("key", ["./key", "key-dir/key", "WORKSPACE/key", "LINK/key"])
def test_an_ssh_command_with_a_key_in_the_workspace_still_refuses(
    agent_in_sandbox: AgentFixture, tmp_path: Path, key: str
) -> None:
    fx = agent_in_sandbox
    allow(fx, "ls *")
    session_id, workspace = repository(fx)
    link = tmp_path / "to-workspace"
    link.symlink_to(workspace)  # outside by its words, inside once followed
    key = key.replace("WORKSPACE", str(workspace)).replace("LINK", str(link))
    host_git(workspace, "config", "core.sshCommand", f"ssh -i {key}")
    output = run(fx, session_id, "ls", ["ls", "-a"])
    assert "a command line that may run a program of the workspace" in output, output
    assert REFUSED in output


def test_a_program_under_proc_that_is_the_workspace_runs_no_unapproved_command(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`core.fsmonitor = /proc/self/cwd/fsmon.sh` is an absolute path outside the
    workspace by its words, and /proc/self/cwd, resolved by Harness, was Harness's own
    directory; for the person's git, run in the work tree, it is the workspace's
    `fsmon.sh`, which an allowed `cp` wrote: their `git status` ran it."""
    fx = agent_in_sandbox
    allow(fx, "cp *")
    session_id, workspace = repository(fx)
    host_git(workspace, "config", "core.fsmonitor", "/proc/self/cwd/fsmon.sh")
    plant_program(workspace, "program")
    output = run(fx, session_id, "plant", ["cp", "evil.sh", "fsmon.sh"])
    assert "a command line that may run a program of the workspace" in output, output
    assert REFUSED in output and not (workspace / "fsmon.sh").exists()
    host_git(workspace, "status")
    assert not (workspace / "program-ran").exists()
    # the premise: what the copy would have put there, the person's git runs
    (workspace / "fsmon.sh").write_bytes((workspace / "evil.sh").read_bytes())
    (workspace / "fsmon.sh").chmod(0o755)
    host_git(workspace, "status")
    assert (workspace / "program-ran").exists()


@pytest.mark.parametrize(
    ("value", "runs"),
    [
        ("ssh -i OUTSIDE/id", False),
        ("ssh -i OUTSIDE/id -F /dev/null", False),
        ("/usr/bin/ssh -i OUTSIDE/id", False),
        ("sh OUTSIDE/hook.sh", False),
        ("ssh -i ./id", True),
        ("ssh -i id", True),
        ("ssh -i WORKSPACE/id", True),
        ("ssh -i WORKSPACE/../w/id", True),
        ("ssh -i LINK/id", True),  # a link into the workspace
        ("ssh -i OUTSIDE/../w/id", True),  # `..` back into it
        ("ssh -i /proc/self/cwd/id", True),
        ("ssh -i /dev/fd/3", True),
        ("ssh -i PROCLINK/id", True),  # a link to /proc/self/cwd
        ("ssh -i OUTSIDE/%d/id", True),  # ssh expands %d
        ("ssh -F /", True),  # a directory holding the workspace
        ("ssh -F PARENT", True),
        ("ssh -i ROOT/other/id", True),  # another session's workspace
        ("/proc/self/cwd/fsmon.sh", True),
    ],
)
def test_which_absolute_paths_count_as_outside(
    tmp_path: Path, settings: Any, value: str, runs: bool
) -> None:
    root = tmp_path / "workspaces"
    settings.HARNESS_WORKSPACE_ROOT = root
    workspace = tmp_path / "w"
    workspace.mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "link").symlink_to(workspace)
    (tmp_path / "proclink").symlink_to("/proc/self/cwd")
    for word, path in [
        ("OUTSIDE", tmp_path / "outside"),
        ("WORKSPACE", workspace),
        ("PROCLINK", tmp_path / "proclink"),
        ("LINK", tmp_path / "link"),
        ("PARENT", tmp_path),
        ("ROOT", root),
    ]:
        value = value.replace(word, str(path))
    assert sandbox_git._runs_workspace_program(workspace, "core.sshcommand", value) is runs


# 2. core.hooksPath inside the workspace (husky)

H = (  # husky 9's `.husky/_/h` (its `husky` file), as a person's `npm install` writes it
    "#!/usr/bin/env sh\n"
    'n=$(basename "$0")\n'
    's=$(dirname "$(dirname "$0")")/$n\n'
    '[ ! -f "$s" ] && exit 0\n'
    'export PATH="node_modules/.bin:$PATH"\n'
    'sh -e "$s" "$@"\n'
)


def husky(workspace: Path) -> None:
    """husky 9's layout: `.husky/_/pre-commit` sources `.husky/_/h`, which runs the
    person's `.husky/pre-commit` (here: it leaves a mark)."""
    hooks = workspace / ".husky" / "_"
    hooks.mkdir(parents=True)
    (hooks / "h").write_text(H)
    (hooks / "pre-commit").write_text('#!/usr/bin/env sh\n. "${0%/*}/h"\n')
    (hooks / "pre-commit").chmod(0o755)
    (hooks / ".gitignore").write_text("*\n")
    (workspace / ".husky" / "pre-commit").write_text("touch person-hook-ran\n")
    host_git(workspace, "config", "core.hooksPath", ".husky/_")
    os.chown(workspace, 0, 0)  # given again to the sandbox user at the run
    sandbox.give_to_sandbox(workspace)


def snapshot(directory: Path) -> dict[str, bytes | str]:
    return {
        str(path.relative_to(directory)): path.read_bytes() if path.is_file() else "dir"
        for path in sorted(directory.rglob("*"))
    }


def test_husky_lets_allowed_commands_run(agent_in_sandbox: AgentFixture) -> None:
    fx = agent_in_sandbox
    allow(fx, "ls *")
    session_id, workspace = repository(fx)
    husky(workspace)
    output = run(fx, session_id, "ls", ["ls", "-a"])
    assert output.startswith("exit code 0\n") and ".husky" in output, output
    # the premise: the person's commit runs the husky hook
    host_git(workspace, "commit", "--allow-empty", "-qm", "base")
    assert (workspace / "person-hook-ran").exists()


def test_husky_hooks_are_read_only_for_an_unapproved_command(
    agent_in_sandbox: AgentFixture,
) -> None:
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    husky(workspace)
    (workspace / "evil.sh").write_text("#!/bin/sh\ntouch agent-ran\n")
    (workspace / "evil.sh").chmod(0o755)
    before = snapshot(workspace / ".husky")
    tricks = [
        "sed -i 's/^/touch agent-ran; /' .husky/_/pre-commit",
        "cp evil.sh .husky/_/pre-commit",
        "cp evil.sh .husky/pre-commit",
        "echo 'touch agent-ran' >> .husky/pre-commit",
        "echo 'touch agent-ran' >> .husky/_/h",
        "cp evil.sh .husky/_/post-commit",
        "ln -sf ../evil.sh .husky/_/pre-commit",
        "mv .husky/_ u2",
        "mv .husky h2 && mkdir -p .husky/_ && cp evil.sh .husky/_/pre-commit",
        "mkdir -p x/_ && cp evil.sh x/_/pre-commit && mv -T x .husky",
        "rm -rf .husky",
    ]
    for trick in tricks:
        output = unapproved(workspace, trick)
        assert not output.startswith("exit code 0"), (trick, output)
        assert "core.hooksPath names in the workspace" in output, (trick, output)
    assert snapshot(workspace / ".husky") == before
    # (`mv .husky/_ u2` copies across the mount, and cannot remove the original)
    assert not (workspace / "h2").exists()
    host_git(workspace, "commit", "--allow-empty", "-qm", "next")
    assert not (workspace / "agent-ran").exists()
    assert (workspace / "person-hook-ran").exists()  # the person's hook, as it was
    # (the person's commit made object directories of its own, root's: a blob of the
    # sandbox user's `git add` landing in one would fail, whatever the guard does)
    owner = sandbox._owner()
    assert owner is not None
    for path in (workspace / ".git" / "objects").rglob("*"):
        os.lchown(path, *owner)
    # what an unapproved command may still do: write elsewhere, use git
    output = unapproved(workspace, "echo x > a.txt && git add a.txt && echo done")
    assert output.startswith("exit code 0\ndone"), output


def test_husky_in_a_nested_repository_is_bound_too(agent_in_sandbox: AgentFixture) -> None:
    fx = agent_in_sandbox
    allow(fx, "ls *")
    session_id, workspace = repository(fx)
    sub = workspace / "sub"
    sub.mkdir()
    host_git(sub, "init", "-q")
    host_git(sub, "config", "user.email", "a@example.org")
    host_git(sub, "config", "user.name", "A")
    husky(sub)
    sandbox.give_to_sandbox(workspace)
    output = run(fx, session_id, "ls", ["ls", "-a", "sub"])
    assert output.startswith("exit code 0\n") and ".husky" in output, output
    output = unapproved(workspace, "echo 'touch agent-ran' >> sub/.husky/pre-commit")
    assert "Read-only file system" in output, output
    host_git(sub, "commit", "--allow-empty", "-qm", "x")
    assert (sub / "person-hook-ran").exists() and not (sub / "agent-ran").exists()


def test_a_hooks_directory_deeper_in_the_workspace_cannot_be_moved_aside(
    agent_in_sandbox: AgentFixture,
) -> None:
    """Each directory from the workspace down to the hooks directory is a mount point."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    hooks = workspace / "tools" / "git" / "hooks"
    hooks.mkdir(parents=True)
    (hooks / "pre-commit").write_text("#!/bin/sh\ntouch person-hook-ran\n")
    (hooks / "pre-commit").chmod(0o755)
    host_git(workspace, "config", "core.hooksPath", "tools/git/hooks")
    (workspace / "evil.sh").write_text("#!/bin/sh\ntouch agent-ran\n")
    (workspace / "evil.sh").chmod(0o755)
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    for trick in [
        "mv tools t2 && mkdir -p tools/git/hooks && cp evil.sh tools/git/hooks/pre-commit",
        "mv tools/git g2 && mkdir -p tools/git/hooks && cp evil.sh tools/git/hooks/pre-commit",
        "cp evil.sh tools/git/hooks/pre-commit",
    ]:
        output = unapproved(workspace, trick)
        assert not output.startswith("exit code 0"), (trick, output)
    # beside it, the directories stay writable
    output = unapproved(workspace, "echo x > tools/notes && echo y > tools/git/notes && echo ok")
    assert output.startswith("exit code 0\nok"), output
    host_git(workspace, "commit", "--allow-empty", "-qm", "x")
    assert (workspace / "person-hook-ran").exists() and not (workspace / "agent-ran").exists()


@pytest.mark.parametrize(
    ("layout", "why"),
    [
        ("missing", "inside the workspace, which does not exist"),
        ("linked", "inside the workspace, through the symbolic link '.husky'"),
        ("linked-inner", "inside the workspace, through the symbolic link '.husky/_'"),
        ("dotdot", "inside the workspace"),
        ("worktree", "inside the workspace, with core.worktree set"),
    ],
)
def test_a_hooks_directory_that_cannot_be_bound_still_refuses(
    agent_in_sandbox: AgentFixture, layout: str, why: str
) -> None:
    """A hooks directory that does not exist (the command could make it), or reached
    through a link (the command could repoint it), or named with `..`, or with the work
    tree set elsewhere: nothing unapproved runs, and the planted hook never does."""
    fx = agent_in_sandbox
    allow(fx, "cp *")
    session_id, workspace = repository(fx)
    value = ".husky/_"
    if layout == "linked":
        (workspace / "real" / "_").mkdir(parents=True)
        (workspace / ".husky").symlink_to("real")
    elif layout == "linked-inner":
        (workspace / ".husky").mkdir()
        (workspace / "real").mkdir()
        (workspace / ".husky" / "_").symlink_to("../real")
    elif layout == "dotdot":
        (workspace / ".husky" / "_").mkdir(parents=True)
        value = "x/../.husky/_"
    elif layout == "worktree":
        (workspace / ".husky" / "_").mkdir(parents=True)
        host_git(workspace, "config", "core.worktree", "..")
    host_git(workspace, "config", "core.hooksPath", value)
    (workspace / "evil.sh").write_text("#!/bin/sh\ntouch agent-ran\n")
    (workspace / "evil.sh").chmod(0o755)
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    target = "real/_/pre-commit" if layout == "linked" else ".husky/_/pre-commit"
    if layout == "linked-inner":
        target = "real/pre-commit"
    call = submit(fx, session_id, "plant", ["cp", "evil.sh", target])
    assert call.status == Status.QUEUED, (call.status, call.reason)
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    assert f"sets core.hookspath = {value!r}, {why}" in call.content, call.content
    assert REFUSED in call.content
    host_git(workspace, "commit", "--allow-empty", "-qm", "x")
    assert not (workspace / "agent-ran").exists()


def test_an_effect_rule_still_writes_nothing_in_a_husky_workspace(
    agent_in_sandbox: AgentFixture,
) -> None:
    """An effect rule's write is Harness's own, outside the sandbox and its binds."""
    _, workspace = repository(agent_in_sandbox)
    husky(workspace)
    why = sandbox_git.unguardable(workspace)
    assert why is not None and "takes hooks from '.husky'" in why, why


def test_husky_with_linked_worktrees_still_refuses(agent_in_sandbox: AgentFixture) -> None:
    """A linked worktree takes a relative hooksPath from its own work tree, which nothing
    binds."""
    _, workspace = repository(agent_in_sandbox)
    host_git(workspace, "commit", "--allow-empty", "-qm", "base")
    host_git(workspace, "worktree", "add", "-q", "wt")
    husky(workspace)
    why = sandbox_git.unguardable(workspace)
    assert why is not None and "with linked worktrees" in why, why


# 3. the bound on the search for nested repositories


@pytest.mark.timeout(300)  # (about 60 s alone; twice that beside another test worker)
def test_a_workspace_of_600000_entries_runs_allowed_commands(
    agent_in_sandbox: AgentFixture,
) -> None:
    """A big node_modules or monorepo: past 500,000 entries every unapproved command
    waited for a reviewer. The bound is 2,000,000 now (1,000,000 entries in 100,000
    directories: about 1 s warm, 6 to 9 s cold here). A `.git` deep inside is still
    found and bound."""
    fx = agent_in_sandbox
    allow(fx, "ls *")
    session_id, workspace = repository(fx)
    modules = workspace / "node_modules"
    try:
        modules.mkdir()
        for index in range(600):
            package = modules / f"p{index}"
            package.mkdir()
            # (no inode each; linked by name within the open directory: 14.5 s at load 9,
            # 51 s by whole paths)
            folder = os.open(package, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.close(os.open("0", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=folder))
                for name in range(1, 1000):
                    os.link("0", str(name), src_dir_fd=folder, dst_dir_fd=folder)
            finally:
                os.close(folder)
        nested = modules / "p599" / "vendored"
        nested.mkdir()
        host_git(nested, "init", "-q")
        (workspace / "evil.gitconfig").write_text('[core]\n\tfsmonitor = "touch ran; true"\n')
        os.chown(workspace, 0, 0)
        sandbox.give_to_sandbox(workspace)
        output = run(fx, session_id, "ls", ["ls", "-a"])
        assert output.startswith("exit code 0\n") and "node_modules" in output, output
        output = unapproved(workspace, "cp evil.gitconfig node_modules/p599/vendored/.git/config")
        assert "Read-only file system" in output, output
        host_git(nested, "status")
        assert not (nested / "ran").exists()
    finally:
        shutil.rmtree(modules, ignore_errors=True)


def test_a_hooks_directory_too_deep_to_bind_refuses(tmp_path: Path) -> None:
    workspace = tmp_path / "workspaces" / "deep"
    deep = Path(*[f"d{index}" for index in range(40)])
    (workspace / deep).mkdir(parents=True)
    host_git(workspace, "init", "-q")
    host_git(workspace, "config", "core.hooksPath", str(deep))
    why = sandbox_git.unguardable(workspace)
    assert why is not None and "more than 32 directories deep" in why, why
    host_git(workspace, "config", "core.hooksPath", str(Path(*deep.parts[:30])))
    assert sandbox_git.unguardable(workspace) is not None  # (bound: effect rules refuse)
    assert "takes hooks from 'd0/" in str(sandbox_git.unguardable(workspace))
