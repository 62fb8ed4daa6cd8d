"""rt11: the git-metadata guard's pointer settings (core.hooksPath, include.path) through
/proc or /dev.

3c9fba8 refused `core.fsmonitor = /proc/self/cwd/fsmon.sh` (a program outside the
workspace by its words; for the person's git, whose cwd is the work tree, the workspace's
`fsmon.sh`). The pointer settings kept the older test, `_inside` by words and by Harness's
own `realpath`: `core.hooksPath = /proc/self/cwd/githooks` passed (Harness's cwd is not
the workspace), nothing was bound, an allowed `cp` wrote `githooks/pre-commit`, and the
person's `git commit` on the host ran it. The same for `[include] path =
/proc/self/cwd/shared.gitconfig` (git resolves it where the person runs git).

Real sandbox (bwrap), real worker, real host git."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from dispatcher.models import AgentSession
from dispatcher.tools import sandbox, sandbox_git
from tests.approvals.conftest import start_session
from tests.redteam.test_git_metadata_guard import (
    agent_in_sandbox,
    allow,
    host_git,
    repository,
)
from tests.redteam.test_git_metadata_guard2 import plant_program
from tests.redteam.test_git_metadata_guard_usable import REFUSED, run
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


@pytest.mark.parametrize("value", ["/proc/self/cwd/githooks", "/dev/fd/../cwd/githooks"])
def test_a_hooks_path_under_proc_runs_no_unapproved_command(
    agent_in_sandbox: AgentFixture, value: str
) -> None:
    fx = agent_in_sandbox
    allow(fx, "mkdir *", "cp *")
    session_id, workspace = repository(fx)
    host_git(workspace, "config", "core.hooksPath", value)
    plant_program(workspace, "hook")
    output = run(fx, session_id, "mkdir", ["mkdir", "githooks"])
    assert REFUSED in output, output
    assert not (workspace / "githooks").exists()
    assert sandbox_git.unguardable(workspace) is not None
    # the premise: a hook there is what the person's commit runs
    (workspace / "githooks").mkdir()
    (workspace / "githooks" / "pre-commit").write_bytes((workspace / "evil.sh").read_bytes())
    (workspace / "githooks" / "pre-commit").chmod(0o755)
    (workspace / "a.txt").write_text("a\n")
    host_git(workspace, "add", "a.txt")
    host_git(workspace, "commit", "-q", "-m", "a")
    assert (workspace / "hook-ran").exists()


def test_an_include_under_proc_runs_no_unapproved_command(agent_in_sandbox: AgentFixture) -> None:
    fx = agent_in_sandbox
    allow(fx, "cp *")
    session_id, workspace = repository(fx)
    host_git(workspace, "config", "include.path", "/proc/self/cwd/shared.gitconfig")
    (workspace / "a").write_text("[core]\n\tfsmonitor = ./evil.sh\n")
    output = run(fx, session_id, "cp", ["cp", "a", "shared.gitconfig"])
    assert REFUSED in output, output
    assert sandbox_git.unguardable(workspace) is not None


# A workspace that is a linked worktree (its `.git` a file naming a git directory outside
# it) or a directory inside another work tree (an agent's fixed workspace `repo/frontend`):
# the configuration git reads there lies outside the workspace and was never read, so a
# hooks directory it names inside the workspace was bound by nothing.


def _worktree_workspace(fx: AgentFixture, tmp_path: Path, hooks: str) -> tuple[str, Path]:
    session_id = start_session(fx)
    workspace = Path(AgentSession.objects.get(pk=session_id).workspace)
    main = tmp_path / "main"
    main.mkdir()
    host_git(main, "init", "-q")
    host_git(main, "config", "user.email", "a@example.org")
    host_git(main, "config", "user.name", "A")
    (main / "a.txt").write_text("a\n")
    host_git(main, "add", "a.txt")
    host_git(main, "commit", "-q", "-m", "a")
    workspace.rmdir()
    host_git(main, "worktree", "add", "-q", str(workspace))
    assert (workspace / ".git").is_file()
    host_git(main, "config", "core.hooksPath", hooks)
    (workspace / "githooks").mkdir()
    sandbox.give_to_sandbox(workspace)
    return session_id, workspace


def _enclosing_workspace(fx: AgentFixture, tmp_path: Path, hooks: str) -> tuple[str, Path]:
    repo = tmp_path / "repo"
    repo.mkdir()
    host_git(repo, "init", "-q")
    host_git(repo, "config", "user.email", "a@example.org")
    host_git(repo, "config", "user.name", "A")
    host_git(repo, "config", "core.hooksPath", f"frontend/{hooks}")
    workspace = repo / "frontend"
    workspace.mkdir()
    (workspace / "githooks").mkdir()
    fx.agent.workspace = str(workspace)
    fx.agent.save(update_fields=["workspace"])
    session_id = start_session(fx)
    sandbox.give_to_sandbox(workspace)
    return session_id, workspace


@pytest.mark.parametrize("layout", ["worktree", "enclosing"])
def test_a_hooks_directory_named_by_a_configuration_outside_the_workspace_is_kept(
    agent_in_sandbox: AgentFixture, tmp_path: Path, layout: str
) -> None:
    fx = agent_in_sandbox
    allow(fx, "cp *")
    make = _worktree_workspace if layout == "worktree" else _enclosing_workspace
    session_id, workspace = make(fx, tmp_path, "githooks")
    plant_program(workspace, "hook")
    output = run(fx, session_id, "plant", ["cp", "evil.sh", "githooks/pre-commit"])
    assert "Read-only file system" in output, output  # bound read-only, not refused
    assert not (workspace / "githooks" / "pre-commit").exists(), output
    (workspace / "b.txt").write_text("b\n")
    host_git(workspace, "add", "b.txt")
    host_git(workspace, "commit", "-q", "-m", "b")
    assert not (workspace / "hook-ran").exists()
    assert sandbox_git.unguardable(workspace) is not None  # (an effect rule's write)
    # the premise: a hook there is what the person's commit runs
    (workspace / "githooks" / "pre-commit").write_bytes((workspace / "evil.sh").read_bytes())
    (workspace / "githooks" / "pre-commit").chmod(0o755)
    (workspace / "c.txt").write_text("c\n")
    host_git(workspace, "add", "c.txt")
    host_git(workspace, "commit", "-q", "-m", "c")
    assert (workspace / "hook-ran").exists()


@pytest.mark.parametrize(
    ("layout", "value"),
    [
        ("worktree", "tools/fsmon.sh"),
        ("enclosing", "frontend/fsmon.sh"),
        ("enclosing", "sh frontend/x"),
        ("enclosing", "!cd frontend && ./t.sh"),
    ],
)
def test_a_command_of_the_workspace_in_a_configuration_outside_it_refuses(
    agent_in_sandbox: AgentFixture, tmp_path: Path, layout: str, value: str
) -> None:
    fx = agent_in_sandbox
    allow(fx, "ls *")
    make = _worktree_workspace if layout == "worktree" else _enclosing_workspace
    session_id, workspace = make(fx, tmp_path, "githooks")
    git_dir = tmp_path / ("main" if layout == "worktree" else "repo")
    host_git(git_dir, "config", "alias.t" if value.startswith("!") else "core.fsmonitor", value)
    output = run(fx, session_id, "ls", ["ls"])
    assert "may run a program of the workspace" in output, output
    assert REFUSED in output


def test_an_enclosing_repository_with_its_own_hooks_and_commands_lets_commands_run(
    agent_in_sandbox: AgentFixture, tmp_path: Path
) -> None:
    fx = agent_in_sandbox
    allow(fx, "ls *")
    session_id, workspace = _enclosing_workspace(fx, tmp_path, "githooks")
    repo = tmp_path / "repo"
    host_git(repo, "config", "core.hooksPath", ".githooks")  # outside the workspace
    host_git(repo, "config", "core.fsmonitor", "tools/fsmon.sh")  # repo/tools: outside
    (workspace / "a.txt").write_text("a\n")
    output = run(fx, session_id, "ls", ["ls"])
    assert output.startswith("exit code 0\n") and "a.txt" in output, output


@pytest.fixture
def alias(tmp_path: Path) -> Any:
    """The workspace `w` mounted at `alias` too (a bind mount: no link to follow), and its
    parent at `parent-alias`."""
    workspace = tmp_path / "w"
    workspace.mkdir()
    (tmp_path / "alias").mkdir()
    (tmp_path / "parent-alias").mkdir()
    mounts = [(workspace, tmp_path / "alias"), (tmp_path, tmp_path / "parent-alias")]
    for source, target in mounts:
        done = subprocess.run(["mount", "--bind", str(source), str(target)], check=False)
        if done.returncode != 0:
            pytest.skip("bind mounts need CAP_SYS_ADMIN")
    yield workspace
    for _, target in reversed(mounts):
        subprocess.run(["umount", "-l", str(target)], check=False)


@pytest.mark.parametrize(
    ("value", "runs"),
    [
        ("ssh -i ALIAS/id", True),
        ("ALIAS/fsmon.sh", True),
        ("sh PARENTALIAS/w/x.sh", True),
        ("ssh -F PARENTALIAS", True),  # a directory holding the workspace
        ("ssh -i OUTSIDE/id", False),
        ("ssh -i ALIAS-not/id", False),
    ],
)
def test_a_path_reaching_the_workspace_through_a_bind_mount_is_inside(
    alias: Path, tmp_path: Path, value: str, runs: bool
) -> None:
    (tmp_path / "outside").mkdir()
    value = value.replace("PARENTALIAS", str(tmp_path / "parent-alias"))
    value = value.replace("ALIAS", str(tmp_path / "alias"))
    value = value.replace("OUTSIDE", str(tmp_path / "outside"))
    assert sandbox_git._runs_workspace_program(alias, "core.sshcommand", value) is runs
    hooks = value.split()[-1]
    git_dir = alias / ".git"
    refused = sandbox_git._config_refusal(alias, git_dir, "core.hookspath", hooks) is not None
    assert refused is runs


@pytest.mark.parametrize(
    ("value", "runs"),
    [
        ("OTHER/tool.sh", True),
        ("sh OTHER/tool.sh", True),
        ("ssh -i OTHER/deeper/key", True),
        ("ssh -i OUTSIDE/key", False),
    ],
)
def test_a_path_the_sandbox_user_owns_is_no_outside_path(
    agent_in_sandbox: AgentFixture, tmp_path: Path, value: str, runs: bool
) -> None:
    """Another agent's fixed workspace (any directory an admin names, given to the sandbox
    user at its first run), or a server's writable path: sandboxed programs write there,
    so a person's configuration naming a program there runs what another agent planted.
    It lay outside Harness's workspace root, the only such place the guard knew."""
    user = sandbox.sandbox_user()
    assert user is not None  # (the fixture: Harness is root, programs run as that user)
    workspace = tmp_path / "w"
    workspace.mkdir()
    other = tmp_path / "other-agent"
    (other / "deeper").mkdir(parents=True)
    sandbox.give_to_sandbox(other)
    (tmp_path / "outside").mkdir()
    value = value.replace("OTHER", str(other)).replace("OUTSIDE", str(tmp_path / "outside"))
    assert sandbox_git._runs_workspace_program(workspace, "core.fsmonitor", value) is runs


@pytest.mark.parametrize("setting", ["core.hooksPath=githooks", "core.fsmonitor=./fsmon.sh"])
def test_a_setting_of_an_included_file_outside_the_workspace_is_judged(
    agent_in_sandbox: AgentFixture, tmp_path: Path, setting: str
) -> None:
    """`[include] path = /etc/team/git.conf` (outside: nothing sandboxed writes it) that
    sets `core.hooksPath = githooks` (relative: the work tree's) or a command of the
    workspace: git takes it as the repository's own, but the guard read the repository's
    file alone (`--no-includes`), and an allowed `cp` planted `githooks/pre-commit`."""
    fx = agent_in_sandbox
    allow(fx, "cp *")
    session_id, workspace = repository(fx)
    shared = tmp_path / "team" / "git.conf"
    shared.parent.mkdir()
    key, value = setting.split("=")
    shared.write_text(f"[{key.split('.')[0]}]\n\t{key.split('.')[1]} = {value}\n")
    host_git(workspace, "config", "include.path", str(shared))
    (workspace / "githooks").mkdir()
    plant_program(workspace, "hook")
    sandbox.give_to_sandbox(workspace)
    output = run(fx, session_id, "plant", ["cp", "evil.sh", "githooks/pre-commit"])
    assert not (workspace / "githooks" / "pre-commit").exists(), output
    if key == "core.hooksPath":
        assert "Read-only file system" in output, output
    else:
        assert REFUSED in output, output
