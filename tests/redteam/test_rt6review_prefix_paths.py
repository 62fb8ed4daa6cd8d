"""git reads a configuration's path that starts `%(prefix)/` under its own installation
prefix (config.c's interpolate_path: system_path, `/usr` for Debian's git), as the
preview's fingerprint must (review of f30d3c1 and 41a13e8, git_outside's `pointer`).

The fingerprint took `%(prefix)/...` for a path relative to the configuration's
directory: a team's `include.path = %(prefix)/share/team.gitconfig` (or any file, by
`%(prefix)/../..`) was never described, and a change there after an approval (an alias,
a filter the command runs) left the fingerprint as it was. (The guard refuses any such
path: sandbox_git._outside takes nothing with a `%` for outside.) Real git."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dispatcher.tools import preview
from tests.support.git_preview import git, repository


def git_prefix() -> Path:
    """Where git's `%(prefix)/` leads (its exec path is `<prefix>/lib/git-core`)."""
    exec_path = subprocess.run(
        ["git", "--exec-path"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return Path(exec_path).parent.parent


def from_prefix(path: Path) -> str:
    """`path` written as `%(prefix)/../../...`: git reads `path`."""
    ups = "/".join([".."] * len(git_prefix().parts))
    return f"%(prefix)/{ups}{path}"


@pytest.mark.parametrize("how", ["up from the prefix", "absolute after it"])
def test_a_prefix_include_changed_after_a_preview_changes_the_fingerprint(
    tmp_path: Path, how: str
) -> None:
    workspace = repository(tmp_path / "ws")
    team = tmp_path / "team.gitconfig"
    team.write_text("[alias]\n\tzz = !echo one\n")
    value = from_prefix(team) if how == "up from the prefix" else f"%(prefix)//{team}"
    git(workspace, "config", "include.path", value)
    assert git(workspace, "config", "alias.zz").strip() == "!echo one"
    seen = preview.fingerprint_of(workspace)
    team.write_text("[alias]\n\tzz = !echo two\n")
    assert git(workspace, "config", "alias.zz").strip() == "!echo two"
    assert preview.fingerprint_of(workspace) != seen
