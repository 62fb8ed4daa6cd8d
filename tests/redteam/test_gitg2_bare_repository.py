"""Red team of a directory of the work tree that git takes for a git directory by its own
names (a bare repository: HEAD, objects/, refs/), which a person's git uses when run in
it or below it (git's default `safe.bareRepository=all`; the sandbox's own git refuses
it). A command no person approved made one (`git init --bare x`, or those names added
to a directory of the project) with a hook or core.pager in its configuration, or wrote
one that was there: the person's `git branch` (reference-transaction hook) or `git log`
(the pager, on a terminal) in it ran the program on the host. Real bwrap, real git."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dispatcher import execution
from dispatcher.models import Status
from dispatcher.policy import profiles
from dispatcher.tools import sandbox
from tests.redteam.test_git_metadata_file_tools import allow_writes, run
from tests.redteam.test_git_metadata_guard import (
    agent_in_sandbox,
    host_git,
    repository,
    submit,
)
from tests.redteam.test_git_metadata_guard2 import sandboxed
from tests.redteam.test_git_metadata_guard_rt12 import G
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db

__all__ = ["agent_in_sandbox"]  # the fixture, used by name


def _person(where: Path, command: str) -> str:
    """`command` (a git command line) as a person runs it in `where` on the host, on a
    terminal (`script`: git starts its pager only there), with `cat` as their pager."""
    env = {**os.environ, "PAGER": "cat"}
    env.pop("GIT_PAGER", None)
    done = subprocess.run(
        ["script", "-qec", command, "/dev/null"],
        cwd=where,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stdout + done.stderr


def _plant(marks: Path, config: str = "git --git-dir=$R config") -> str:
    """Shell that gives the bare repository at `$R` a pager and a reference-transaction
    hook leaving files in `marks` (`config`: how it sets a key)."""
    return (
        f"{config} core.pager 'touch {marks}/pager; cat' && mkdir -p $R/hooks "
        f"&& printf '#!/bin/sh\\ntouch {marks}/hook\\n' > $R/hooks/reference-transaction "
        "&& chmod +x $R/hooks/reference-transaction"
    )


def _workspace(fx: AgentFixture, *, bare: str = "") -> tuple[str, Path, Path]:
    if shutil.which("script") is None:
        pytest.skip("no `script` to give git a terminal")
    session_id, workspace = repository(fx)
    (workspace / "src").mkdir()
    (workspace / "src" / "main.py").write_text("print()\n")
    host_git(workspace, *G, "add", "src")
    host_git(workspace, *G, "commit", "-qm", "src")
    if bare:
        host_git(workspace, "init", "-q", "--bare", bare)
        host_git(workspace, *G, "push", "-q", f"./{bare}", "HEAD:refs/heads/master")
    marks = workspace.parent / f"{workspace.name}-marks"
    marks.mkdir()
    os.chown(workspace, 0, 0)
    sandbox.give_to_sandbox(workspace)
    return session_id, workspace, marks


def _nothing_ran(where: Path, marks: Path) -> str:
    said = _person(where, "git -c safe.directory=* status")
    said += _person(where, "git -c safe.directory=* log")
    said += _person(where, "git -c safe.directory=* branch topic")
    assert not list(marks.iterdir()), said
    return said


def test_a_bare_repository_a_command_makes_runs_nothing_for_the_person(
    agent_in_sandbox: AgentFixture,
) -> None:
    """`git init --bare x`, a commit pushed to it, a pager and a hook: HEAD removed."""
    _, workspace, marks = _workspace(agent_in_sandbox)
    script = "R=x && git init -q --bare x && git push -q ./x HEAD:refs/heads/master && "
    output = sandboxed(workspace, script + _plant(marks) + " && echo made")
    assert "made" in output, output
    assert "made 'x' a git directory" in output and "HEAD was removed" in output, output
    assert not (workspace / "x" / "HEAD").exists()
    _nothing_ran(workspace / "x", marks)


def test_a_directory_of_the_project_made_a_git_directory_runs_nothing(
    agent_in_sandbox: AgentFixture,
) -> None:
    """HEAD, objects/ and refs/ added by hand to the project's `src/`, with a
    configuration: the person's git in `src/` took it for its git directory. Its HEAD
    is removed; the project's files stay."""
    _, workspace, marks = _workspace(agent_in_sandbox)
    script = (
        "R=src && mkdir src/objects src/refs && echo 'ref: refs/heads/master' > src/HEAD && "
        "cp -r .git/objects/. src/objects/ && cp -r .git/refs/. src/refs/ && "
    )
    output = sandboxed(workspace, script + _plant(marks) + " && echo made")
    assert "made" in output, output
    assert "made 'src' a git directory" in output, output
    assert (workspace / "src" / "main.py").read_text() == "print()\n"
    _nothing_ran(workspace / "src", marks)


def test_a_bare_repository_that_was_there_is_guarded_as_a_git_directory(
    agent_in_sandbox: AgentFixture,
) -> None:
    """A bare repository of the person's in the work tree: its configuration and hooks
    are read-only for a command no person approved, as a `.git`'s."""
    _, workspace, marks = _workspace(agent_in_sandbox, bare="remote.git")
    output = sandboxed(workspace, "R=remote.git && " + _plant(marks) + "; echo tried")
    assert "tried" in output, output
    assert "Read-only file system" in output or "Device or resource busy" in output, output
    _nothing_ran(workspace / "remote.git", marks)
    assert (workspace / "remote.git" / "HEAD").exists()


def test_a_write_file_that_would_make_a_directory_a_git_directory_asks(
    agent_in_sandbox: AgentFixture,
) -> None:
    """A command made `src/objects/`, `src/refs/` and `src/config` with a pager (no git
    directory yet: the check after it has nothing to judge), then an allowed write_file
    of `src/HEAD`, outside the sandbox, made `src/` one. Such a write is git metadata
    now: a reviewer must approve it."""
    fx = agent_in_sandbox
    session_id, workspace, marks = _workspace(fx)
    script = "R=src && mkdir src/objects src/refs && cp -r .git/objects/. src/objects/ && "
    script += "cp -r .git/refs/. src/refs/ && " + _plant(marks, "git config --file src/config")
    output = sandboxed(workspace, script + " && echo made")
    assert "made" in output and "harness:" not in output, output
    allow_writes(fx)
    call = run(fx, session_id, "head", "src/HEAD", "ref: refs/heads/master\n")
    assert call.status == Status.COMPLETED and call.is_error, (call.status, call.content)
    assert "A call a reviewer approves may write it" in call.content, call.content
    assert not (workspace / "src" / "HEAD").exists()
    _nothing_ran(workspace / "src", marks)
    assert run(fx, session_id, "app", "src/app.py", "print(1)\n").status == Status.COMPLETED


def test_an_effect_rule_does_not_make_a_directory_a_git_directory(
    agent_in_sandbox: AgentFixture, settings: Any
) -> None:
    """`src/objects/`, `src/refs/` and `src/config` with a pager and a hook (an earlier
    run's, no git directory yet), then `effect(write: **)` allowing a command that writes
    `src/HEAD`: Harness applies the effect outside the sandbox, where no check after a
    run follows it. The ask stands."""
    fx = agent_in_sandbox
    settings.HARNESS_PREVIEW = True
    settings.HARNESS_PREVIEW_TIMEOUT = 5
    profiles.update_profile(
        user=fx.owner,
        mode="standard",
        allow=["effect(write: **, network: none)"],
        ask=[],
        deny=[],
        actor="test",
    )
    session_id, workspace, marks = _workspace(fx)
    shutil.copytree(workspace / ".git" / "objects", workspace / "src" / "objects")
    shutil.copytree(workspace / ".git" / "refs", workspace / "src" / "refs")
    hook = workspace / "src" / "hooks" / "reference-transaction"
    hook.parent.mkdir()
    hook.write_text(f"#!/bin/sh\ntouch {marks}/hook\n")
    hook.chmod(0o755)
    (workspace / "src" / "config").write_text(f"[core]\n\tpager = touch {marks}/pager; cat\n")
    sandbox.give_to_sandbox(workspace)
    script = "echo 'ref: refs/heads/master' > src/HEAD"
    call = submit(fx, session_id, "head", ["bash", "-c", script])
    if call.status == Status.QUEUED:
        execution.execute_call(str(call.pk))
        call.refresh_from_db()
    _nothing_ran(workspace / "src", marks)
    assert call.status == Status.PENDING_APPROVAL, (call.status, call.decided_by, call.content)
