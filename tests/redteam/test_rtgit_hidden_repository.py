"""Red team (rtgit) of a git directory hidden where the guard's walk does not look (inside
a `.git`: `.git/objects/xx`, never descended into) and named by a key git itself sets: a
command no person approved made a bare repository with a `pre-receive` hook in the
workspace's `.git/objects/`, and `git init sub && git -C sub remote add origin
../.git/objects/xx` (`remote.origin.url` is among the keys a made `.git` may hold); the
person's `git push` in `sub` ran the hook on the host. Also a repository made in one
effect (`git init --bare x` with a hook), which an effect rule checked path by path and
applied: the person's `git branch` in `x` ran the hook. Real bwrap, real git."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dispatcher import execution
from dispatcher.models import Status
from dispatcher.policy import profiles
from dispatcher.tools import sandbox
from tests.redteam.test_git_metadata_file_tools import allow_writes, run
from tests.redteam.test_git_metadata_guard import agent_in_sandbox, host_git, repository, submit
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_git_metadata_guard_rt12 import G
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


def _hook(where: str, mark: Path, hook: str = "pre-receive") -> str:
    """Shell giving the git directory `where` a `hook` that leaves `mark`."""
    return (
        f"mkdir -p {where}/hooks && printf '#!/bin/sh\\ntouch {mark}\\n' > {where}/hooks/{hook}"
        f" && chmod +x {where}/hooks/{hook}"
    )


def _person(where: Path, *args: str) -> str:
    """git as the person runs it in `where` on the host, their global configuration
    trusting the sandbox user's directories (`safe.directory = *`: as root, or with the
    workspace theirs, none of git's ownership checks stands between them and it)."""
    config = where.parent / f"{where.name}-gitconfig"
    config.write_text("[safe]\n\tdirectory = *\n")
    done = subprocess.run(
        ["git", *G, *args],
        cwd=where,
        env={**os.environ, "GIT_CONFIG_GLOBAL": str(config)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stdout + done.stderr


def _workspace(fx: AgentFixture) -> tuple[str, Path, Path]:
    session_id, workspace = repository(fx)
    (workspace / "a").write_text("a\n")
    host_git(workspace, *G, "add", "a")
    host_git(workspace, *G, "commit", "-qm", "a")
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    return session_id, workspace, workspace.parent / f"{workspace.name}-hook-ran"


SUB = "git init -q sub && git -C sub -c user.email=a@b -c user.name=A commit -q --allow-empty -m x"


def test_a_repository_hidden_in_git_objects_runs_nothing_at_a_push(
    agent_in_sandbox: AgentFixture,
) -> None:
    _, workspace, mark = _workspace(agent_in_sandbox)
    script = (
        f"{SUB} && git init -q --bare .git/objects/xx && {_hook('.git/objects/xx', mark)} && "
        "git -C sub remote add origin ../.git/objects/xx; echo done"
    )
    output = sandboxed(workspace, script)
    assert "done" in output, output
    assert "'.git/objects/xx' was removed" in output, output
    said = _person(workspace / "sub", "push", "origin", "HEAD:refs/heads/master")
    assert not mark.exists(), (output, said)
    assert not (workspace / ".git" / "objects" / "xx").exists()
    assert host_git(workspace, "log", "--oneline").count("\n") == 1  # the person's objects


def test_a_directory_of_git_made_a_git_directory_runs_nothing_at_a_push(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`.git/logs` holds HEAD (a reflog, whose first line git reads as an object id) and
    `refs/`: an `objects/` made there makes it a git directory to git, with the hooks
    and configuration the command gives it. It loses its HEAD (the reflog of HEAD)."""
    _, workspace, mark = _workspace(agent_in_sandbox)
    script = (
        f"{SUB} && mkdir .git/logs/objects && {_hook('.git/logs', mark)} && "
        "git -C sub remote add origin ../.git/logs; echo done"
    )
    output = sandboxed(workspace, script)
    assert "done" in output and "'.git/logs/HEAD' was removed" in output, output
    said = _person(workspace / "sub", "push", "origin", "HEAD:refs/heads/master")
    assert not mark.exists(), (output, said)


def test_a_made_repository_hiding_one_in_its_own_logs_is_removed(
    agent_in_sandbox: AgentFixture,
) -> None:
    _, workspace, mark = _workspace(agent_in_sandbox)
    script = (
        f"{SUB} && git init -q --bare sub/.git/logs/xx && {_hook('sub/.git/logs/xx', mark)}"
        " && git -C sub remote add origin .git/logs/xx; echo done"
    )
    output = sandboxed(workspace, script)
    assert "done" in output, output
    assert "made the git directory 'sub/.git', which holds a git directory" in output, output
    assert not (workspace / "sub" / ".git").exists()
    said = _person(workspace / "sub", "push", "origin", "HEAD:refs/heads/master")
    assert not mark.exists(), (output, said)


def test_a_plain_made_repository_with_a_remote_is_kept(agent_in_sandbox: AgentFixture) -> None:
    _, workspace, _ = _workspace(agent_in_sandbox)
    output = sandboxed(workspace, f"{SUB} && git -C sub remote add origin ../up.git; echo done")
    assert "done" in output and "harness:" not in output, output
    assert (workspace / "sub" / ".git" / "HEAD").exists()


def test_a_write_file_completing_a_hidden_repository_asks(agent_in_sandbox: AgentFixture) -> None:
    """A run leaves `.git/objects/xx/` with `objects/`, `refs/` and an executable hook but
    no HEAD (no git directory yet: nothing to remove), and the remote naming it; an
    allowed write_file of its HEAD, outside the sandbox, would make it one."""
    fx = agent_in_sandbox
    session_id, workspace, mark = _workspace(fx)
    script = (
        f"{SUB} && mkdir -p .git/objects/xx/objects .git/objects/xx/refs && "
        f"{_hook('.git/objects/xx', mark)} && git -C sub remote add origin ../.git/objects/xx"
        "; echo done"
    )
    output = sandboxed(workspace, script)
    assert "done" in output and "harness:" not in output, output
    allow_writes(fx)
    call = run(fx, session_id, "head", ".git/objects/xx/HEAD", "ref: refs/heads/master\n")
    assert call.status == Status.COMPLETED and call.is_error, (call.status, call.content)
    assert "A call a reviewer approves may write it" in call.content, call.content
    assert not (workspace / ".git" / "objects" / "xx" / "HEAD").exists()
    said = _person(workspace / "sub", "push", "origin", "HEAD:refs/heads/master")
    assert not mark.exists(), said
    # git's own files in `.git` stay writable, as before
    assert not run(fx, session_id, "desc", ".git/description", "x\n").is_error


def test_an_effect_rule_does_not_apply_a_repository_made_in_one_effect(
    agent_in_sandbox: AgentFixture, settings: Any
) -> None:
    fx = agent_in_sandbox
    settings.HARNESS_PREVIEW = True
    settings.HARNESS_PREVIEW_TIMEOUT = 20
    profiles.update_profile(
        user=fx.owner,
        mode="standard",
        allow=["effect(write: **, network: none)"],
        ask=[],
        deny=[],
        actor="test",
    )
    session_id, workspace, mark = _workspace(fx)
    script = (
        "git init -q --bare x && cp -r .git/objects/. x/objects/ && cp -r .git/refs/. x/refs/"
        f" && {_hook('x', mark, 'reference-transaction')}"
    )
    call = submit(fx, session_id, "bare", ["bash", "-c", script])
    if call.status == Status.QUEUED:
        execution.execute_call(str(call.pk))
        call.refresh_from_db()
    assert call.status == Status.PENDING_APPROVAL, (call.status, call.decided_by, call.content)
    assert not (workspace / "x").exists()
    # an effect that makes no git directory is still allowed
    call = submit(fx, session_id, "build", ["bash", "-c", "mkdir -p out/refs && echo 1 > out/a"])
    if call.status == Status.QUEUED:
        execution.execute_call(str(call.pk))
        call.refresh_from_db()
    assert call.status == Status.COMPLETED, (call.status, call.decided_by, call.content)
    assert (workspace / "out" / "a").read_text() == "1\n"


def test_a_dot_git_hidden_in_git_objects_runs_nothing_at_a_push(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`.git/objects/zz/.git`: git's receive-pack takes `URL/.git` for the URL's
    repository (enter_repo), and the walk of the work tree enters no `.git`."""
    _, workspace, mark = _workspace(agent_in_sandbox)
    script = (
        f"{SUB} && mkdir .git/objects/zz && git init -q --bare .git/objects/zz/.git && "
        f"{_hook('.git/objects/zz/.git', mark)} && "
        "git -C sub remote add origin ../.git/objects/zz; echo done"
    )
    output = sandboxed(workspace, script)
    assert "done" in output and "'.git/objects/zz/.git' was removed" in output, output
    said = _person(workspace / "sub", "push", "origin", "HEAD:refs/heads/master")
    assert not mark.exists(), (output, said)


def test_a_repository_hidden_deep_in_git_objects_is_removed(
    agent_in_sandbox: AgentFixture,
) -> None:
    """300 levels down (found as the walk of the work tree finds one: at any depth)."""
    _, workspace, mark = _workspace(agent_in_sandbox)
    script = (
        "cd .git/objects && for i in $(seq 300); do mkdir d && cd d || exit 1; done && "
        f"git init -q --bare xx && {_hook('xx', mark)}; echo done"
    )
    output = sandboxed(workspace, script)
    assert "done" in output and "/d/d/xx' was removed" in output, output[-600:]
    assert not any(path.name == "xx" for path in (workspace / ".git" / "objects").rglob("xx"))
