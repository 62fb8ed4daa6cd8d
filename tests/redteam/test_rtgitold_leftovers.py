"""Red team (gitold) of what the git guard left after the last stop, with real bwrap and
the person's real git (2.39) afterwards:

- a symbolic link in a guarded `.git` older than the guard (planted before Harness removed
  links, an upgrade, or by a command a reviewer approved) was never removed: only links
  with a ctime since the guard were, and `.git/COMMIT_EDITMSG -> ~/.bashrc` had every
  later `git commit -m` of the person's write its message over that file;
- a FIFO in the work tree hung the person's git: it opens `.gitignore` and
  `.gitattributes` (any depth) and `.mailmap` by name, and a loose object in a directory
  `.git/objects/info/alternates` names, with no O_NONBLOCK;
- `.git/worktrees/x/gitdir` was writable: the person's `git worktree repair` wrote
  `gitdir: <workspace>/.git/worktrees/x` into the directory it named (their home), which
  so became a work tree of the agent's repository;
- a hook that is a link into the work tree (`.git/hooks/pre-commit ->
  ../../scripts/pre-commit.sh`) ran what an unapproved command wrote there."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from dispatcher.tools import sandbox, sandbox_git
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.run_command import TOOL as RUN_COMMAND
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_git_metadata_guard_rt12 import G
from tests.redteam.test_rtgit_git_links import _workspace, agent_in_sandbox
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


def person(workspace: Path, *args: str) -> str:
    """The person's git in `workspace`, on the host; a failure of the test if it hangs."""
    try:
        done = subprocess.run(
            ["git", "-c", "safe.directory=*", *G, *args],
            cwd=workspace,
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the person's git {args[0]} hung")
    return done.stdout + done.stderr


def older_than_a_guard(path: Path) -> None:
    """Wait until a guard made now takes the link `path` for one made before it (its
    ctime before the guard's start, less the margin for the kernel's coarse clock)."""
    ctime = os.lstat(path).st_ctime_ns
    while time.time_ns() - sandbox_git.LINK_MARGIN_NS <= ctime:
        time.sleep(0.05)


def approved(workspace: Path, script: str) -> str:
    """`bash -c script` run as a command a reviewer approved (the guard's NONE)."""
    ctx = ExecutionContext(
        workspace=workspace, call_id="t", timeout=30, output_limit=20_000, git_guard="none"
    )
    return str(RUN_COMMAND.execute(ctx, {"argv": ["bash", "-c", script]}))


def test_a_link_planted_before_the_guard_writes_nothing_outside(
    agent_in_sandbox: AgentFixture,
) -> None:
    """An upgrade: the link was made before Harness looked for links (here, on the host)."""
    workspace, home = _workspace(agent_in_sandbox)
    link = workspace / ".git" / "COMMIT_EDITMSG"
    link.unlink(missing_ok=True)
    link.symlink_to(home / ".bashrc")
    older_than_a_guard(link)
    output = sandboxed(workspace, "echo done")
    assert "done" in output, output
    person(workspace, "commit", "-q", "--allow-empty", "-m", "mine")
    assert (home / ".bashrc").read_text() == "precious\n"
    assert "as a symbolic link" in output and ".git/COMMIT_EDITMSG" in output, output


def test_a_link_an_approved_command_planted_is_removed_by_the_next_unapproved_run(
    agent_in_sandbox: AgentFixture,
) -> None:
    """The reviewer approved a command, not a link every later git of the person's
    writes through: it goes at the next run no person approved."""
    workspace, home = _workspace(agent_in_sandbox)
    output = approved(workspace, f"rm .git/logs/HEAD && ln -s {home}/.bashrc .git/logs/HEAD")
    assert output.startswith("exit code 0"), output
    older_than_a_guard(workspace / ".git" / "logs" / "HEAD")
    output = sandboxed(workspace, "echo done")
    assert "done" in output, output
    person(workspace, "checkout", "-qb", "topic")
    assert (home / ".bashrc").read_text() == "precious\n"
    assert ".git/logs/HEAD" in output, output


def test_the_persons_own_old_links_in_git_are_kept(
    agent_in_sandbox: AgentFixture, tmp_path: Path
) -> None:
    """A symbolic ref (core.preferSymlinkRefs) and a store kept elsewhere (`lfs`,
    `objects`) stay, whatever their age: git reads them as its own. (Elsewhere: not in
    Harness's workspace root, where other sessions' commands write, nor the workspace:
    `test_rt2gitold_kept_links.py`.)"""
    workspace, _ = _workspace(agent_in_sandbox)
    git = workspace / ".git"
    store = tmp_path / "lfs"
    store.mkdir()
    (git / "lfs").symlink_to(store)
    (git / "HEAD").unlink()
    (git / "HEAD").symlink_to("refs/heads/master")
    older_than_a_guard(git / "HEAD")
    output = sandboxed(workspace, "git status --short && echo done")
    assert "done" in output and "harness:" not in output, output
    assert os.readlink(git / "lfs") == str(store)
    assert os.readlink(git / "HEAD") == "refs/heads/master"
    assert "On branch master" in person(workspace, "status")


@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("mkfifo .gitignore", ["status", "--short"]),
        ("mkdir -p d/e && mkfifo d/e/.gitattributes", ["status", "--short"]),
        ("mkfifo .mailmap", ["log", "--format=%aN"]),
        (
            # (a loose object the run moved out of `.git/objects`, looked up in the
            # directory of the work tree that `objects/info/alternates` names)
            "b=$(git rev-parse HEAD:a) && mkdir -p store/${b:0:2} && "
            "mkfifo store/${b:0:2}/${b:2} && echo $PWD/store > .git/objects/info/alternates "
            "&& rm -f .git/objects/${b:0:2}/${b:2}",
            ["log", "-p"],
        ),
    ],
    ids=["gitignore", "gitattributes", "mailmap", "alternates"],
)
def test_a_fifo_in_the_work_tree_hangs_no_persons_git(
    agent_in_sandbox: AgentFixture, script: str, args: list[str]
) -> None:
    workspace, _ = _workspace(agent_in_sandbox)
    output = sandboxed(workspace, f"{script} && echo done")
    assert "done" in output, output
    person(workspace, *args)
    fifos = [path for path in workspace.rglob("*") if path.is_fifo()]
    assert fifos == [], fifos
    assert "as a FIFO" in output, output


def test_a_worktrees_gitdir_has_no_persons_repair_write_outside(
    agent_in_sandbox: AgentFixture,
) -> None:
    workspace, home = _workspace(agent_in_sandbox)
    elsewhere = workspace.parent / f"{workspace.name}-worktree"
    person(workspace, "worktree", "add", "-q", str(elsewhere))
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)  # (the person's worktree, theirs as the rest)
    gitdir = workspace / ".git" / "worktrees" / elsewhere.name / "gitdir"
    output = sandboxed(workspace, f"echo {home}/.git > {gitdir.relative_to(workspace)}; echo done")
    assert "done" in output, output
    person(workspace, "worktree", "repair")
    assert sorted(path.name for path in home.iterdir()) == [".bashrc"]
    assert gitdir.read_text() == f"{elsewhere}/.git\n"
    assert "Read-only file system" in output or "Device or resource busy" in output, output


def _linked_hook(workspace: Path, named: str) -> None:
    """`.git/hooks/pre-commit -> named`, as a person sets up a hook kept in the project."""
    (workspace / "scripts").mkdir()
    (workspace / "scripts" / "pre-commit.sh").write_text("#!/bin/sh\nexit 0\n")
    (workspace / "scripts" / "pre-commit.sh").chmod(0o755)
    (workspace / ".git" / "hooks" / "pre-commit").symlink_to(named)
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)


def test_a_hook_linked_into_the_work_tree_runs_nothing_planted(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`.git/hooks/pre-commit -> ../../scripts/pre-commit.sh`: the link is read-only with
    `hooks/`, but what it names was not, and an unapproved `printf >` over it had the
    person's next commit run it. It is bound read-only as a `core.hooksPath` is."""
    workspace, home = _workspace(agent_in_sandbox)
    _linked_hook(workspace, "../../scripts/pre-commit.sh")
    # (nor does an effect rule allow a write there: Harness applies it outside the sandbox)
    assert "'scripts/pre-commit.sh'" in (sandbox_git.unguardable(workspace) or "")
    plant = f"printf '#!/bin/sh\\ntouch {home}/ran\\n' > scripts/pre-commit.sh"
    output = sandboxed(workspace, f"{plant}; mv scripts s2; echo done")
    assert "done" in output, output
    assert "Read-only file system" in output and "Device or resource busy" in output, output
    person(workspace, "commit", "-q", "--allow-empty", "-m", "mine")
    assert not (home / "ran").exists(), output
    output = sandboxed(workspace, "echo x > scripts/other && cat scripts/other")
    assert output.startswith("exit code 0\nx"), output  # (the rest of scripts/ stays writable)


@pytest.mark.parametrize("named", ["../../scripts/missing.sh", "../../scripts"])
def test_a_hook_linked_to_what_a_command_could_make_lets_nothing_run(
    agent_in_sandbox: AgentFixture, named: str
) -> None:
    workspace, _ = _workspace(agent_in_sandbox)
    _linked_hook(workspace, named)
    with pytest.raises(ToolError) as refused:
        sandboxed(workspace, "echo ran > ran")
    assert "A reviewer must approve" in str(refused.value), refused.value
    assert "pre-commit" in str(refused.value), refused.value
    assert not (workspace / "ran").exists()
