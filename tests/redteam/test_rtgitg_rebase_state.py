"""Red team of the rebase-todo defusal (sandbox_git._defuse_todos): the merge strategy a
rebase or a cherry-pick records (`rebase-merge/strategy`, `sequencer/opts`'s
`options.strategy`) is run as `git-merge-<strategy>`, and a strategy holding a `/` is a
path in the work tree: an unapproved command that wrote `x/evil` there and
`git-merge-x/evil` in the workspace had the person's `git rebase --continue` (or
`git cherry-pick --continue`) run `evil` on the host. Real bwrap, real git."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dispatcher.tools import sandbox
from dispatcher.tools.base import ToolError
from tests.redteam.test_git_metadata_guard import agent_in_sandbox, host_git, repository
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_git_metadata_guard_rt12 import G
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name

EVIL = "mkdir -p git-merge-x && printf '#!/bin/sh\\ntouch {mark}\\nexit 1\\n' > git-merge-x/evil"
EVIL += " && chmod +x git-merge-x/evil"


def _commits(workspace: Path, *names: str) -> None:
    for name in names:
        (workspace / name).write_text(f"{name}\n")
        host_git(workspace, *G, "add", name)
        host_git(workspace, *G, "commit", "-qm", name)


def test_a_strategy_a_command_records_in_a_rebase_does_not_run_at_the_persons_continue(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`git rebase -i` stopped at a `break`, then `x/evil` written to
    `.git/rebase-merge/strategy` and the picks reordered (no fast-forward): the person's
    `git rebase --continue` ran `git-merge-x/evil` on the host. A strategy the run wrote
    that is not one of git's own is removed; the rebase goes on with git's default."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    _commits(workspace, "a", "b", "c")
    mark = workspace / "strategy-ran"
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    script = (
        f"GIT_SEQUENCE_EDITOR=\"sed -i '1i break'\" git -c user.email=a@b -c user.name=A "
        "rebase -q -i HEAD~2; head=$(cat .git/rebase-merge/orig-head); "
        "printf 'pick %s\\npick %s\\n' $head $(git rev-parse $head~1) "
        "> .git/rebase-merge/git-rebase-todo && echo x/evil > .git/rebase-merge/strategy && "
        f"{EVIL.format(mark=mark)} && echo planted"
    )
    output = sandboxed(workspace, script)
    assert "planted" in output, output
    assert not mark.exists(), output
    person = host_git(workspace, *G, "rebase", "--continue")
    assert not mark.exists(), (output, person)
    assert "merge strategy" in output and "x/evil" in output, output
    assert not (workspace / ".git" / "rebase-merge" / "strategy").exists()


def test_a_strategy_a_command_records_in_a_cherry_pick_does_not_run_at_the_persons_continue(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`git cherry-pick A B` stopped on a conflict, then `options.strategy = x/evil` in
    `.git/sequencer/opts`: the person's `git cherry-pick --continue` ran it."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    _commits(workspace, "a")
    host_git(workspace, *G, "checkout", "-qb", "side")
    (workspace / "a").write_text("side\n")
    host_git(workspace, *G, "commit", "-qam", "side a")
    _commits(workspace, "c")
    host_git(workspace, *G, "checkout", "-q", "-")
    (workspace / "a").write_text("main\n")
    host_git(workspace, *G, "commit", "-qam", "main a")
    mark = workspace / "strategy-ran"
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    script = (
        "git -c user.email=a@b -c user.name=A cherry-pick side~1 side; "
        "test -f .git/sequencer/todo && printf '[options]\\n\\tstrategy = x/evil\\n' "
        f">> .git/sequencer/opts && {EVIL.format(mark=mark)} && echo planted"
    )
    output = sandboxed(workspace, script)
    assert "planted" in output, output
    (workspace / "a").write_text("resolved\n")
    host_git(workspace, "add", "a")
    person = subprocess.run(
        ["git", "-c", "safe.directory=*", *G, "cherry-pick", "--continue"],
        cwd=workspace,
        env={**os.environ, "GIT_EDITOR": "true"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert not mark.exists(), (output, person.stdout, person.stderr)
    assert "merge strategy" in output and "x/evil" in output, output


def test_a_rebase_todo_a_command_makes_too_large_to_read_is_not_left_to_run(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`git rebase -i -x CMD` stopped at a `break`, then the todo padded past the 1 MiB
    the guard reads: the guard said so to the model but left the todo, and the person's
    `git rebase --continue` ran CMD on the host. A todo that cannot be read after the
    run is removed (the person's continue stops; `git rebase --abort` works)."""
    fx = agent_in_sandbox
    _, workspace = repository(fx)
    _commits(workspace, "a", "b", "c")
    mark = workspace / "exec-ran"
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    script = (
        f"GIT_SEQUENCE_EDITOR=\"sed -i '1i break'\" git -c user.email=a@b -c user.name=A "
        f"rebase -q -i -x 'touch {mark}' HEAD~2; "
        "python3 -c \"open('.git/rebase-merge/git-rebase-todo', 'a').write(('#' * 99 + "
        "'\\n') * 12000)\" && echo padded"
    )
    try:
        output = sandboxed(workspace, script)
    except ToolError as error:
        output = str(error)
    assert not mark.exists(), output
    person = host_git(workspace, *G, "rebase", "--continue")
    assert not mark.exists(), (output, person)
    assert not (workspace / ".git" / "rebase-merge" / "git-rebase-todo").exists(), output
    assert "more than 1 MiB" in output and "removed" in output, output
    host_git(workspace, *G, "rebase", "--abort")
    assert "c" in host_git(workspace, "log", "-1", "--format=%s")
