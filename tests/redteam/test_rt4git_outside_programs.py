"""A previewed effect is applied only while the programs git's configuration names outside
the workspace are as they were (red team of the preview's fingerprint,
git_outside.outside_state).

The fingerprint took the configurations git reads, wherever they lie, and the files and
hooks directories they include or name; not the programs a command-valued key runs
(`core.fsmonitor`, `filter.*.clean`, `diff.external`, an `!` alias, `credential.helper`,
`core.sshCommand` ...) when they lie outside the workspace, on a read-only entry the
sandbox shows (`/team/bin/clean`). Such a program changed between the approval and the
apply changed what the command would do, and the effect previewed under the old one was
applied all the same. Now each file a command line names outside the workspace (its
program, or a file handed to it) is described by identity, mode, size and times: the call
ends `edited` and a new preview asks again. Real git, real bwrap, the worker's own code
path."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from dispatcher import execution
from dispatcher.models import Status, ToolCall
from dispatcher.tools import preview, sandbox_git
from tests.approvals.conftest import ask
from tests.approvals.test_preview_approval import reviewer_client
from tests.approvals.test_preview_outside_git import previews_on
from tests.support.factories import AgentFixture
from tests.support.git_preview import (
    approve,
    approved_preview,
    asked_again,
    assert_fingerprint_follows,
    git,
    outside_program,
    repository,
    session_repository,
    team,
)

pytestmark = pytest.mark.django_db
__all__ = ["previews_on", "reviewer_client"]  # the fixtures, used by name

COMMAND = ["sh", "-c", "git greet > greeting.txt; echo said"]


def _greeting(agent: AgentFixture, tmp_path: Path, settings: Any) -> tuple[str, Path, Path]:
    """(a new session of `agent`, its workspace, whose repository's `git greet` runs `sh
    team/greet.sh`, a program outside it on a read-only entry; that program)."""
    program = team(tmp_path, settings) / "greet.sh"
    program.write_text("echo hello\n")
    session_id, workspace = session_repository(agent)
    git(workspace, "config", "alias.greet", f"!sh {program}")
    return session_id, workspace, program


def test_a_program_an_alias_runs_outside_the_workspace_changed_after_the_approval_asks_again(
    previews_on: None,
    agent: AgentFixture,
    reviewer_client: Client,
    settings: Any,
    tmp_path: Path,
) -> None:
    session_id, workspace, program = _greeting(agent, tmp_path, settings)
    approval, shown = approved_preview(agent, reviewer_client, session_id, COMMAND, "greeting.txt")
    assert "+hello" in shown, shown

    # Between the approval and the apply, the program outside the workspace changes.
    program.write_text("echo goodbye\n")
    execution.execute_call(str(approval.call_id))

    _, shown = asked_again(approval, workspace, "greeting.txt")  # (nothing run)
    assert "+goodbye" in shown and "hello" not in shown, shown


def test_an_unchanged_outside_program_applies_the_effect(
    previews_on: None, agent: AgentFixture, reviewer_client: Client, settings: Any, tmp_path: Path
) -> None:
    session_id, workspace, _ = _greeting(agent, tmp_path, settings)
    approval = ask(agent, {"argv": COMMAND}, session_id=session_id, name="run_command")
    approve(reviewer_client, approval)
    execution.execute_call(str(approval.call_id))
    call = ToolCall.objects.get(pk=approval.call_id)
    assert call.status == Status.COMPLETED, (call.status, call.content)
    assert (workspace / "greeting.txt").read_text() == "hello\n"


# (key, value with {p} for the program's absolute path)
SETTINGS = [
    ("core.fsmonitor", "{p}"),
    ("filter.team.clean", "python3 {p} %f"),
    ("filter.team.process", "{p} --serve"),
    ("diff.external", "{p}"),
    ("core.sshCommand", "ssh -i {p} -F /dev/null"),
    ("credential.helper", "store --file={p}"),
    ("alias.t", '!f() { {p} "$@"; }; f | head'),
    ("core.pager", "less -FRX --lesskey-file={p}"),
    ("gpg.program", "{p}"),
    ("merge.team.driver", "{p} %O %A %B"),
]


@pytest.mark.parametrize(("key", "value"), SETTINGS)
def test_the_fingerprint_takes_each_program_a_configuration_names_outside(
    tmp_path: Path, key: str, value: str
) -> None:
    workspace = repository(tmp_path / "ws")
    program = outside_program(tmp_path)
    git(workspace, "config", key, value.replace("{p}", str(program)))
    # (changed in place: the same inode)
    assert_fingerprint_follows(workspace, lambda: program.write_text("#!/bin/sh\nexit 1\n"))


def test_the_fingerprint_takes_a_program_of_every_configuration_git_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's system configuration's programs, one a link names (retargeted to an
    equal file), and a relative one of the repository above the workspace (git runs it
    in that work tree, outside the workspace)."""
    system = tmp_path / "gitconfig"
    monkeypatch.setattr(sandbox_git, "SYSTEM_CONFIG", system)
    above = repository(tmp_path / "repo")
    (above / "tools").mkdir()
    workspace = above / "ws"
    workspace.mkdir()
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text("#!/bin/sh\n")
    second.write_text("#!/bin/sh\n")
    link = tmp_path / "fsmonitor"
    link.symlink_to(first)
    system.write_text(f"[core]\n\tfsmonitor = {shlex.quote(str(link))}\n")
    git(above, "config", "filter.team.clean", "tools/clean.sh")
    relative = above / "tools" / "clean.sh"
    relative.write_text("#!/bin/sh\ncat\n")
    seen = {preview.fingerprint_of(workspace)}
    assert preview.fingerprint_of(workspace) in seen
    link.unlink()
    link.symlink_to(second)  # (the same content, another file)
    now = preview.fingerprint_of(workspace)
    assert now not in seen
    seen.add(now)
    relative.write_text("#!/bin/sh\ntr a b\n")
    assert preview.fingerprint_of(workspace) not in seen


def test_a_configuration_that_names_no_file_outside_costs_no_git_read() -> None:
    """A configuration is read (a git process each fingerprint) only when it may name a
    file the fingerprint must take: one as `git init`, `git remote add` and `git lfs
    install` make it, or with a credential helper found on PATH, is not."""
    from dispatcher.tools import git_outside

    plain = (
        b"[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
        b'\tlogallrefupdates = true\n[remote "origin"]\n\turl = https://example.com/r.git\n'
        b'\tfetch = +refs/heads/*:refs/remotes/origin/*\n[branch "main"]\n'
        b"\tremote = origin\n\tmerge = refs/heads/main\n[user]\n\tname = A\n"
        b'[filter "lfs"]\n\tclean = git-lfs clean -- %f\n\tsmudge = git-lfs smudge -- %f\n'
        b"\tprocess = git-lfs filter-process\n\trequired = true\n"
        b'[credential "https://source.developers.google.com"]\n\thelper = gcloud.sh\n'
    )
    assert not git_outside._names_files(plain, False)
    assert git_outside._names_files(plain, True)  # (`sh x` run in a work tree outside)
    for named in (
        b"[core]\n\tfsmonitor = /x\n",
        b"[core] editor=~bob/x\n",
        b"[ALIAS]\n\tst = !/x\n",
        b'[pager "log"]\n\tx = 1\n[core]\n\tpager = less\n[a]\n\tb = /x\n',
        b'[filter "x"]\n\tclean = sh \\\n /x\n',
        b"[include]\n\tpath = x\n",
        b'[mergetool "x"]\n\tpath = y\n',
    ):
        assert git_outside._names_files(named, False), named
