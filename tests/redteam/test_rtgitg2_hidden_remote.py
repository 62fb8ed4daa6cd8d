"""Red team (rtgitg2) of a git directory the guard's walk does not look in (one inside a
`.git` directory: `.git/objects/xx`, never descended into) reached by the legacy remote
files git reads for a remote its configuration does not name (`remotes/<name>`:
`URL: .git/objects/xx`, `branches/<name>`). A command no person approved made both in
the workspace's `.git` (neither is bound), or in a `.git` it made (`git init` makes an
empty `branches/`, which was not looked in): the person's plain `git push` ran
`git-receive-pack` in the hidden repository, and its `pre-receive` hook, on the host.
Real bwrap, real git."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dispatcher.models import Status
from dispatcher.tools import sandbox
from tests.redteam.test_git_metadata_file_tools import allow_writes, run
from tests.redteam.test_git_metadata_guard import agent_in_sandbox, host_git, repository
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_git_metadata_guard_rt12 import G
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


def _hidden(git_dir: str, mark: Path) -> str:
    """Shell making a bare repository at `git_dir/objects/xx` whose pre-receive hook
    leaves `mark`."""
    where = f"{git_dir}/objects/xx"
    return (
        f"git init -q --bare {where} && "
        f"printf '#!/bin/sh\\ntouch {mark}\\n' > {where}/hooks/pre-receive && "
        f"chmod +x {where}/hooks/pre-receive"
    )


def _person_push(where: Path) -> str:
    """`git push origin HEAD:refs/heads/master` as the person runs it in `where` on the
    host, whose global configuration trusts the sandbox user's directories
    (`safe.directory = *`: the workspace and all in it belong to that user, so their git
    works there only so; a `-c` of the command line is not passed to a local remote's
    `git-receive-pack`)."""
    config = where.parent / f"{where.name}-gitconfig"
    config.write_text("[safe]\n\tdirectory = *\n")
    done = subprocess.run(
        ["git", *G, "push", "origin", "HEAD:refs/heads/master"],
        cwd=where,
        env={**os.environ, "GIT_CONFIG_GLOBAL": str(config)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stdout + done.stderr


def _workspace(fx: AgentFixture) -> tuple[Path, Path]:
    _, workspace = repository(fx)
    (workspace / "a").write_text("a\n")
    host_git(workspace, *G, "add", "a")
    host_git(workspace, *G, "commit", "-qm", "a")
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    return workspace, workspace.parent / f"{workspace.name}-pushed"


@pytest.mark.parametrize(
    "legacy",
    [
        "mkdir -p .git/remotes && printf 'URL: .git/objects/xx\\nPush: refs/heads/*:refs/heads/*\\n'"
        " > .git/remotes/origin",
        "mkdir -p .git/branches && printf '.git/objects/xx\\n' > .git/branches/origin",
    ],
    ids=["remotes", "branches"],
)
def test_a_remote_file_naming_a_hidden_repository_runs_nothing_at_a_push(
    agent_in_sandbox: AgentFixture, legacy: str
) -> None:
    workspace, mark = _workspace(agent_in_sandbox)
    output = sandboxed(workspace, f"{_hidden('.git', mark)} && {legacy}; echo done")
    assert "done" in output, output
    said = _person_push(workspace)
    assert not mark.exists(), (output, said)
    assert host_git(workspace, "log", "--oneline").count("\n") == 1


def test_a_made_repository_with_a_branches_file_runs_nothing_at_a_push(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`git init sub` (a `.git` as git makes it, kept) with `branches/origin` naming a
    repository hidden in its own `objects/`: the person's `git push` in `sub`."""
    workspace, mark = _workspace(agent_in_sandbox)
    script = (
        "git init -q sub && git -C sub -c user.email=a@b -c user.name=A commit -q "
        "--allow-empty -m x && "
        + _hidden("sub/.git", mark)
        + " && printf '.git/objects/xx\\n' > sub/.git/branches/origin; echo done"
    )
    output = sandboxed(workspace, script)
    assert "done" in output, output
    said = _person_push(workspace / "sub")
    assert not mark.exists(), (output, said)


def test_a_made_bare_repository_with_a_remote_file_loses_its_head(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`git init --bare x` with `remotes/origin` naming a repository hidden in its
    `objects/`: more than `git init --bare` makes, so git no longer takes `x` for a git
    directory (the person's `git push` in it pushes nowhere)."""
    workspace, mark = _workspace(agent_in_sandbox)
    script = (
        "git init -q --bare x && git push -q ./x HEAD:refs/heads/master && "
        + _hidden("x", mark)
        + " && mkdir x/remotes && printf 'URL: objects/xx\\n' > x/remotes/origin; echo done"
    )
    output = sandboxed(workspace, script)
    assert "done" in output and "made 'x' a git directory" in output, output
    assert "holds 'remotes/origin'" in output, output
    said = _person_push(workspace / "x")
    assert not mark.exists(), (output, said)


def test_a_write_file_of_a_remote_file_asks(agent_in_sandbox: AgentFixture) -> None:
    """write_file runs outside the sandbox: `.git/remotes/origin` is git metadata now."""
    fx = agent_in_sandbox
    session_id, workspace = repository(fx)
    allow_writes(fx)
    call = run(fx, session_id, "remote", ".git/remotes/origin", "URL: .git/objects/xx\n")
    assert call.status == Status.COMPLETED and call.is_error, (call.status, call.content)
    assert "A call a reviewer approves may write it" in call.content, call.content
    assert not (workspace / ".git" / "remotes" / "origin").exists()
