"""Names the file tools' git refusal folds as the case-insensitive file systems Linux
mounts compare them (red team of the git guard's folding, sandbox_git.fold).

`fold` took case and canonical decomposition as exfat-fuse does, but Linux's own exFAT
and vfat drivers (the kernel's `exfat`, which replaced exfat-fuse on most hosts since
5.7, and `vfat`) also drop a name's trailing dots (`exfat_striptail_len`,
`vfat_striptail_len`): there `.git./hooks/pre-commit` is `.git/hooks/pre-commit`, and a
write_file or delete_file by that name was let through as a plain file. exFAT's up-case
table, as Windows formats it, takes `ı` (dotless i) for `I`, where case folding keeps it
apart. This machine mounts neither driver (no kernel module; exfat-fuse keeps trailing
dots), so the names are checked as the tools judge them, on a file system that keeps
case: refused, which there only refuses more, as `fold` says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools import sandbox_git
from dispatcher.tools.base import ExecutionContext, ToolError
from dispatcher.tools.delete_file import TOOL as DELETE_FILE
from dispatcher.tools.write_file import TOOL as WRITE_FILE
from tests.redteam.test_git_metadata_guard import host_git as _git

PERSON = "#!/bin/sh\necho person-gate\n"


def _call(tool: object, workspace: Path, arguments: dict[str, str]) -> str:
    ctx = ExecutionContext(workspace=workspace, call_id="fg", timeout=30, output_limit=4000)
    try:
        return str(tool.execute(ctx, arguments))  # type: ignore[attr-defined]
    except ToolError as refused:
        return f"refused: {refused}"


@pytest.mark.parametrize(
    "name", [".git./hooks/pre-commit", ".git../config", ".GIT. /HOOKS./x", ".gıt/hooks/x"]
)
def test_git_metadata_by_a_name_a_driver_strips_is_guarded(name: str) -> None:
    assert sandbox_git.guarded_path(name)


def test_plain_dots_stay_what_they_are() -> None:
    assert sandbox_git.fold(".") == "." and sandbox_git.fold("..") == ".."
    assert not sandbox_git.guarded_path("src/git./hooks/x")


@pytest.mark.parametrize("name", [".githooks./pre-commit", ".GITHOOKS../pre-commit"])
def test_a_hooks_path_hook_by_a_name_with_trailing_dots_is_refused(
    tmp_path: Path, settings: Any, name: str
) -> None:
    settings.HARNESS_SANDBOX = "off"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    _git(workspace, "init", "-q")
    (workspace / ".githooks").mkdir()
    (workspace / ".githooks" / "pre-commit").write_text(PERSON)
    _git(workspace, "config", "core.hooksPath", ".githooks")
    said = _call(WRITE_FILE, workspace, {"path": name, "content": "#!/bin/sh\nevil\n"})
    assert said.startswith(f"refused: '{name}' is a git hook"), said
    said = _call(DELETE_FILE, workspace, {"path": ".git./hooks/pre-commit"})
    assert said.startswith("refused: '.git./hooks/pre-commit' is git metadata"), said
