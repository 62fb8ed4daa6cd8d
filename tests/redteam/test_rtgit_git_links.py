"""Red team (rtgit) of a symbolic link a command no person approved leaves in a guarded
git directory: git writes through one (`COMMIT_EDITMSG`, a reflog, a directory of
`refs/`), and the sandbox lets the command make one naming any path of the host (dangling
inside it). `.git/COMMIT_EDITMSG -> ~/.bashrc` had the person's `git commit -m` write its
message over that file; `.git/logs/HEAD -> ...` appended the reflog (with a branch name
the command chose) to it; `.git/refs/heads -> ...` had `git branch x` write a file there.
Real bwrap, real git."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dispatcher import execution
from dispatcher.models import AgentSession, Status
from dispatcher.policy import profiles
from dispatcher.tools import sandbox
from tests.redteam.test_git_metadata_guard import agent_in_sandbox, host_git, repository, submit
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_git_metadata_guard_rt12 import G
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


def _workspace(fx: AgentFixture) -> tuple[Path, Path]:
    _, workspace = repository(fx)
    (workspace / "a").write_text("a\n")
    host_git(workspace, *G, "add", "a")
    host_git(workspace, *G, "commit", "-qm", "a")
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    outside = workspace.parent / f"{workspace.name}-home"
    outside.mkdir()
    (outside / ".bashrc").write_text("precious\n")
    return workspace, outside


@pytest.mark.parametrize(
    ("link", "person"),
    [
        ("ln -sf {home}/.bashrc .git/COMMIT_EDITMSG", ["commit", "--allow-empty", "-m", "mine"]),
        ("rm .git/logs/HEAD && ln -s {home}/.bashrc .git/logs/HEAD", ["checkout", "-qb", "x"]),
        ("rm -r .git/refs/tags && ln -s {home} .git/refs/tags", ["tag", "v1"]),
    ],
    ids=["COMMIT_EDITMSG", "logs-HEAD", "refs-directory"],
)
def test_a_link_left_in_git_writes_nothing_outside_at_a_persons_git(
    agent_in_sandbox: AgentFixture, link: str, person: list[str]
) -> None:
    workspace, home = _workspace(agent_in_sandbox)
    output = sandboxed(workspace, link.format(home=home) + " && echo done")
    assert "done" in output, output
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", *G, *person],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (home / ".bashrc").read_text() == "precious\n", done.stdout + done.stderr
    assert sorted(path.name for path in home.iterdir()) == [".bashrc"]
    assert "as a symbolic link" in output, output


def test_git_at_work_in_the_sandbox_leaves_no_note(agent_in_sandbox: AgentFixture) -> None:
    workspace, _ = _workspace(agent_in_sandbox)
    script = (
        "git checkout -qb topic && echo b > b && git add b && "
        "git -c user.email=a@b -c user.name=A commit -qm b && git tag v1 && echo done"
    )
    output = sandboxed(workspace, script)
    assert "done" in output and "harness:" not in output, output
    assert "topic" in host_git(workspace, "branch")


@pytest.mark.parametrize(
    ("script", "where", "person"),
    [
        (
            "git init -q sub && git -C sub -c user.email=a@b -c user.name=A commit -q "
            "--allow-empty -m x && rm sub/.git/logs/HEAD && ln -s {home}/.bashrc "
            "sub/.git/logs/HEAD",
            "sub",
            ["commit", "--allow-empty", "-m", "mine"],
        ),
        (
            "git init -q --bare x && cp -r .git/objects/. x/objects/ && cp -r .git/refs/. "
            "x/refs/ && ln -s {home}/.bashrc x/FETCH_HEAD",
            "x",
            ["fetch", "-q", "..", "master"],
        ),
    ],
    ids=["made-dot-git", "made-bare"],
)
def test_a_link_in_a_made_repository_writes_nothing_outside(
    agent_in_sandbox: AgentFixture, script: str, where: str, person: list[str]
) -> None:
    workspace, home = _workspace(agent_in_sandbox)
    output = sandboxed(workspace, script.format(home=home) + " && echo done")
    assert "done" in output, output
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", *G, *person],
        cwd=workspace / where,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (home / ".bashrc").read_text() == "precious\n", (output, done.stdout + done.stderr)
    assert "a symbolic link" in output or "the symbolic link" in output, output


def test_an_effect_rule_does_not_apply_a_link_in_git(
    agent_in_sandbox: AgentFixture, settings: Any
) -> None:
    """An effect is applied outside the sandbox, where no check after a run follows it:
    `effect(write: **)` applied `.git/COMMIT_EDITMSG -> ~/.bashrc`."""
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
    workspace, home = _workspace(fx)
    session_id = str(AgentSession.objects.get(workspace=str(workspace)).pk)
    call = submit(fx, session_id, "link", ["ln", "-sf", f"{home}/.bashrc", ".git/COMMIT_EDITMSG"])
    if call.status == Status.QUEUED:
        execution.execute_call(str(call.pk))
        call.refresh_from_db()
    host_git(workspace, *G, "commit", "--allow-empty", "-qm", "mine")
    assert (home / ".bashrc").read_text() == "precious\n", (call.status, call.content)
    assert call.status == Status.PENDING_APPROVAL, (call.status, call.decided_by, call.content)
