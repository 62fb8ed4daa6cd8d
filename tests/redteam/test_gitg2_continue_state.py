"""Red team of what else an operation under way keeps for a person's `--continue`
(sandbox_git._defuse_strategies), and of the checks after a run that one failing check
skipped (sandbox_git.remove_made). Real bwrap, real git (2.39 here): a signing key a
command no person approved left in `rebase-merge/gpg_sign_opt` or `sequencer/opts` had
the person's `git rebase --continue` (`git cherry-pick --continue`) run their signing
program on the commits the command chose; a walk past MAX_WALK in a submodule's git
directory skipped the todo check after it, and the person's continue ran the `exec`
lines the command left."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dispatcher.tools import sandbox, sandbox_git
from dispatcher.tools.base import ToolError
from tests.redteam.test_git_metadata_guard import agent_in_sandbox, host_git, repository
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_git_metadata_guard_rt12 import G
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name

BREAK = "GIT_SEQUENCE_EDITOR=\"sed -i '1i break'\" git -c user.email=a@b -c user.name=A "


def _commits(workspace: Path, *names: str) -> None:
    for name in names:
        (workspace / name).write_text(f"{name}\n")
        host_git(workspace, *G, "add", name)
        host_git(workspace, *G, "commit", "-qm", name)


def _person(workspace: Path, mark: Path, *args: str) -> str:
    """git as the person runs it on the host, with a signing program (`gpg` first on
    their PATH, as their own would be) that leaves `mark` when it runs."""
    bin_dir = workspace.parent / f"{workspace.name}-bin"
    bin_dir.mkdir(exist_ok=True)
    gpg = bin_dir / "gpg"
    gpg.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    gpg.chmod(0o755)
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", *G, *args],
        cwd=workspace,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GIT_EDITOR": "true"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stdout + done.stderr


def _ready(workspace: Path) -> None:
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)


def test_a_signing_key_a_command_leaves_in_a_rebase_is_put_back(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`git rebase -i` stopped at a `break`, then `-S` written to
    `.git/rebase-merge/gpg_sign_opt`: the person's `git rebase --continue` ran `gpg
    -bsau` on the commits the command chose."""
    _, workspace = repository(agent_in_sandbox)
    _commits(workspace, "a", "b", "c")
    mark = workspace.parent / f"{workspace.name}-signed"
    _ready(workspace)
    script = (
        BREAK + "rebase -q -i HEAD~2; echo -SDEADBEEF > .git/rebase-merge/gpg_sign_opt && echo set"
    )
    output = sandboxed(workspace, script)
    assert "set" in output, output
    person = _person(workspace, mark, "rebase", "--continue")
    assert not mark.exists(), (output, person)
    assert "sign its commits" in output and "-SDEADBEEF" in output, output
    assert not (workspace / ".git" / "rebase-merge" / "gpg_sign_opt").exists()
    assert "c" in host_git(workspace, "log", "-1", "--format=%s")


def test_a_signing_key_a_command_leaves_in_a_cherry_pick_is_put_back(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`git cherry-pick A B` stopped on a conflict, then `gpg-sign` in
    `.git/sequencer/opts`: the person's `git cherry-pick --continue` ran gpg."""
    _, workspace = repository(agent_in_sandbox)
    _commits(workspace, "a")
    host_git(workspace, *G, "checkout", "-qb", "side")
    (workspace / "a").write_text("side\n")
    host_git(workspace, *G, "commit", "-qam", "side a")
    _commits(workspace, "c")
    host_git(workspace, *G, "checkout", "-q", "-")
    (workspace / "a").write_text("main\n")
    host_git(workspace, *G, "commit", "-qam", "main a")
    mark = workspace.parent / f"{workspace.name}-signed"
    _ready(workspace)
    script = (
        "git -c user.email=a@b -c user.name=A cherry-pick side~1 side; test -f "
        ".git/sequencer/todo && printf '[options]\\n\\tgpg-sign = DEADBEEF\\n' >> .git/sequencer/opts "
        "&& echo set"
    )
    output = sandboxed(workspace, script)
    assert "set" in output, output
    (workspace / "a").write_text("resolved\n")
    host_git(workspace, "add", "a")
    person = _person(workspace, mark, "cherry-pick", "--continue")
    assert not mark.exists(), (output, person)
    assert "sign its commits" in output and "DEADBEEF" in output, output
    opts = workspace / ".git" / "sequencer" / "opts"
    assert not opts.exists() or "gpg-sign" not in opts.read_text()


def test_a_check_that_fails_after_a_run_does_not_skip_the_todo_check(
    agent_in_sandbox: AgentFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submodule's git directory whose `objects/` the command filled past MAX_WALK
    (a ToolError in `_keep_git_directories`), and `git rebase -i -x CMD` stopped at a
    `break`: the error skipped `_defuse_todos`, and the person's continue ran CMD. Now
    the call still fails, and the `exec` lines are made comments."""
    monkeypatch.setattr(sandbox_git, "MAX_WALK", 40)
    _, workspace = repository(agent_in_sandbox, module=True)
    _commits(workspace, "a", "b", "c")
    mark = workspace.parent / f"{workspace.name}-exec"
    _ready(workspace)
    script = (
        BREAK + f"rebase -q -i -x 'touch {mark}' HEAD~2; "
        "mkdir .git/modules/lib/objects/many && touch .git/modules/lib/objects/many/f{1..60}"
    )
    with pytest.raises(ToolError) as raised:
        sandboxed(workspace, script)
    assert f"more than {sandbox_git.MAX_WALK} entries" in str(raised.value), raised.value
    todo = (workspace / ".git" / "rebase-merge" / "git-rebase-todo").read_text()
    assert f"# exec touch {mark}" in todo, todo
    person = host_git(workspace, *G, "rebase", "--continue")
    assert not mark.exists(), person
