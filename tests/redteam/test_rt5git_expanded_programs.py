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
from dispatcher.tools import sandbox
from tests.approvals.test_preview_approval import reviewer_client
from tests.approvals.test_preview_outside_git import previews_on
from tests.support.factories import AgentFixture
from tests.support.git_preview import (
    approved_preview,
    asked_again,
    assert_fingerprint_follows,
    git,
    outside_file,
    outside_program,
    repository,
    session_repository,
    team,
)

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
    program = team(tmp_path, settings) / "greet.sh"
    program.write_text("echo hello\n")
    session_id, workspace = session_repository(agent)
    git(workspace, "config", "alias.greet", f"!sh ~/{_up_from_home(program)}")
    approval, shown = approved_preview(agent, reviewer_client, session_id, COMMAND, "greeting.txt")
    assert "+hello" in shown, shown  # (the sandbox's shell found it)

    program.write_text("echo HACKED\n")  # (in place: the same inode)
    execution.execute_call(str(approval.call_id))

    _, shown = asked_again(approval, workspace, "greeting.txt")
    assert "+HACKED" in shown, shown


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
    workspace = repository(tmp_path / "ws")
    program = outside_program(tmp_path)
    value = spelled.format(up=_up_from_home(program), rel="../bin/tool")
    git(workspace, "config", "alias.t", value)
    # (in place: the same inode)
    assert_fingerprint_follows(workspace, lambda: program.write_text("#!/bin/sh\nexit 1\n"))


@pytest.mark.parametrize("key", ["include.path", "core.hooksPath"])
def test_the_fingerprint_takes_a_file_a_configuration_names_from_home(
    tmp_path: Path, key: str
) -> None:
    """git expands `~/` of an include or a hooks directory with the HOME it runs with,
    the sandbox's when previewed: `~/../../team/x` is /team/x."""
    workspace = repository(tmp_path / "ws")
    if key == "include.path":
        named = outside_file(tmp_path, "[core]\n\tfsmonitor = false\n", "x.gitconfig")
    else:
        named = tmp_path / "team" / "hooks"
        named.mkdir(parents=True)
    git(workspace, "config", key, f"~/{_up_from_home(named)}")

    def change() -> None:
        if key == "include.path":
            named.write_text("[core]\n\tfsmonitor = /team/fsmon\n")  # (in place)
        else:
            (named / "pre-commit").write_text("#!/bin/sh\n")

    assert_fingerprint_follows(workspace, change)
