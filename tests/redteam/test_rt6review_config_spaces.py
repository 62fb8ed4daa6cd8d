"""A previewed effect is applied only while every configuration git reads is as it was,
one whose key follows a carriage return too (review of f30d3c1, git_outside's
`_names_files`).

git skips a carriage return before a key as it skips a space or a tab (config.c's
isspace: `\\t`, `\\n`, `\\r`, ` `): `[include]` then `\\rpath = /team/x.gitconfig` includes
/team/x.gitconfig. The fingerprint's first look at a configuration, whether it may name a
file at all (a git process to read it is spent only then), took a key only after spaces
and tabs: such a configuration was never read, the file it includes never described, and
a change there (an alias, a filter the command runs) after the approval left the
fingerprint as it was. Real git, the worker's fingerprint."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.tools import git_outside, preview
from tests.support.git_preview import git, repository

CONFIGURATIONS = {
    "include": b"[include]\n\rpath = {team}\n",
    "include after a header": b"[include]\r path = {team}\n",
    "command": b"[core]\n\rfsmonitor = {program}\n",
}


@pytest.mark.parametrize("written", sorted(CONFIGURATIONS))
def test_a_key_after_a_carriage_return_is_read_as_git_reads_it(
    tmp_path: Path, written: str
) -> None:
    workspace = repository(tmp_path / "ws")
    team = tmp_path / "team.gitconfig"
    team.write_text("[alias]\n\tzz = !echo one\n")
    program = tmp_path / "fsmonitor"
    program.write_text("#!/bin/sh\nexit 1\n")
    config = workspace / ".git" / "config"
    line = (
        CONFIGURATIONS[written]
        .replace(b"{team}", bytes(team))
        .replace(b"{program}", bytes(program))
    )
    config.write_bytes(config.read_bytes() + line)
    described = git_outside.outside_state(workspace, workspace, [".git"])
    named = team if written != "command" else program
    assert str(named) in described, described
    seen = preview.fingerprint_of(workspace)
    if written == "command":
        program.write_text("#!/bin/sh\nexit 0\n")
    else:
        assert git(workspace, "config", "alias.zz").strip() == "!echo one"
        team.write_text("[alias]\n\tzz = !echo two\n")
        assert git(workspace, "config", "alias.zz").strip() == "!echo two"
    assert preview.fingerprint_of(workspace) != seen
