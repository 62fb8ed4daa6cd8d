"""A previewed effect is applied only while the programs git's configuration names outside
the workspace are as they were, however the command line spells their path (red team of
f30d3c1, git_outside._named_files).

A command-valued key's word starting `~/`, `$HOME/` or `$PWD/` was taken for nothing
outside the workspace ("the sandbox's HOME is empty"); but the sandboxed shell git runs
the command in expands it, and `~/../../team/greet.sh` is /team/greet.sh: that program
changed between the approval and the apply, and the effect previewed under the old one
was applied. Now such a word is read where the sandbox's shell finds it (HOME is
sandbox.HOME; PWD the work tree git runs it in). Real git, real bwrap, the worker's own
code path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from dispatcher import execution
from dispatcher.models import Preview, Status, ToolCall
from dispatcher.tools import preview, sandbox
from tests.approvals.conftest import ask, start_session
from tests.approvals.test_preview_approval import _workspace, reviewer_client
from tests.approvals.test_preview_outside_git import _approve, _git, _team, previews_on
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db
__all__ = ["previews_on", "reviewer_client"]  # the fixtures, used by name

COMMAND = ["sh", "-c", "git greet > greeting.txt; echo said"]


def _up_from_home(program: Path) -> str:
    """`program` spelled from the sandbox's HOME (`~/../../tmp/.../greet.sh`)."""
    return "../" * sandbox.HOME.count("/") + str(program).lstrip("/")


def test_a_program_named_from_home_changed_after_the_approval_asks_again(
    previews_on: None,
    agent: AgentFixture,
    reviewer_client: Client,
    settings: Any,
    tmp_path: Path,
) -> None:
    program = _team(tmp_path, settings) / "greet.sh"
    program.write_text("echo hello\n")
    session_id = start_session(agent)
    workspace = _workspace(agent)
    _git(workspace, "init", "-q")
    _git(workspace, "config", "alias.greet", f"!sh ~/{_up_from_home(program)}")
    approval = ask(agent, {"argv": COMMAND}, session_id=session_id, name="run_command")
    preview_row = Preview.objects.get(call=approval.call)
    assert preview_row.appliable, preview_row.note
    shown = next(c for c in preview_row.effect["changes"] if c["path"] == "greeting.txt")
    assert "+hello" in shown["diff"], shown  # (the sandbox's shell found it)
    _approve(reviewer_client, approval)

    program.write_text("echo HACKED\n")  # (in place: the same inode)
    execution.execute_call(str(approval.call_id))

    original = ToolCall.objects.get(pk=approval.call_id)
    assert original.status == Status.EDITED, (original.status, original.content)
    assert not (workspace / "greeting.txt").exists()
    again = ToolCall.objects.get(edited_from=original)
    shown = next(c for c in again.preview.effect["changes"] if c["path"] == "greeting.txt")
    assert "+HACKED" in shown["diff"], shown


@pytest.mark.parametrize(
    "spelled",
    [
        "!sh ~/{up}",
        "!sh $HOME/{up}",
        "!sh ${{HOME}}/{up}",
        '!sh "$HOME"/{up}',
        "!sh $PWD/{rel}",
        "!sh ${{PWD}}/{rel}",
    ],
)
def test_the_fingerprint_takes_a_program_named_from_home_or_pwd(
    tmp_path: Path, spelled: str
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    _git(workspace, "init", "-q")
    program = tmp_path / "bin" / "tool"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\n")
    value = spelled.format(up=_up_from_home(program), rel="../bin/tool")
    _git(workspace, "config", "alias.t", value)
    seen = preview.fingerprint_of(workspace)
    assert preview.fingerprint_of(workspace) == seen  # (unchanged: the same)
    program.write_text("#!/bin/sh\nexit 1\n")  # (in place: the same inode)
    assert preview.fingerprint_of(workspace) != seen


@pytest.mark.parametrize("key", ["include.path", "core.hooksPath"])
def test_the_fingerprint_takes_a_file_a_configuration_names_from_home(
    tmp_path: Path, key: str
) -> None:
    """git expands `~/` of an include or a hooks directory with the HOME it runs with,
    the sandbox's when previewed: `~/../../team/x` is /team/x."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    _git(workspace, "init", "-q")
    team = tmp_path / "team"
    team.mkdir()
    named = team / ("x.gitconfig" if key == "include.path" else "hooks")
    if key == "include.path":
        named.write_text("[core]\n\tfsmonitor = false\n")
    else:
        named.mkdir()
    _git(workspace, "config", key, f"~/{_up_from_home(named)}")
    seen = preview.fingerprint_of(workspace)
    assert preview.fingerprint_of(workspace) == seen  # (unchanged: the same)
    if key == "include.path":
        named.write_text("[core]\n\tfsmonitor = /team/fsmon\n")  # (in place)
    else:
        (named / "pre-commit").write_text("#!/bin/sh\n")
    assert preview.fingerprint_of(workspace) != seen
