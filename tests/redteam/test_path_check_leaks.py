"""Red team: what a refused path says never names a path outside the workspace that only
Harness could have found. Harness resolves an agent's path as root (the guard, then each
file tool), following every symlink, also those of trees the agent's sandbox never shows;
when that resolve meets a symlink loop, Python's message names the path it had reached."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.tools import list_directory, read_file
from dispatcher.tools._paths import path_violation
from dispatcher.tools.base import ExecutionContext, ToolError


def test_a_symlink_loop_outside_is_refused_without_naming_where_it_was(tmp_path: Path) -> None:
    """Before the fix: "Path 'a' cannot be resolved (Symlink loop from
    '/.../person/private/deep/loop')": the agent, which knows only person/hidden (a link
    it may name, never read), learnt where it leads."""
    person = tmp_path / "person"
    (person / "private" / "deep").mkdir(parents=True)
    (person / "private" / "deep" / "loop").symlink_to("loop")
    (person / "hidden").symlink_to(person / "private" / "deep")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "a").symlink_to(person / "hidden" / "loop")  # what the agent may write

    said = path_violation("a", workspace)
    # (Since the loop is outside, it is never looked at: the link leaves the workspace.)
    assert said is not None and "outside the session workspace" in said, said
    assert "private" not in said, said
    ctx = ExecutionContext(workspace=workspace, call_id="t", timeout=10, output_limit=10_000)
    with pytest.raises(ToolError) as refused:
        read_file.TOOL.execute(ctx, {"path": "a/x"})
    assert "private" not in str(refused.value), refused.value


def test_list_directory_never_says_whether_a_path_outside_is_a_directory(tmp_path: Path) -> None:
    """Before the fix a symlink's entry ended in "/" when its target was a directory,
    followed wherever it led: an agent's link to /home/NAME or to another agent's
    workspace told it which exist (its sandbox shows neither)."""
    (tmp_path / "others" / "agent-7").mkdir(parents=True)
    workspace = tmp_path / "workspace"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "there").symlink_to(tmp_path / "others" / "agent-7")
    (workspace / "not-there").symlink_to(tmp_path / "others" / "agent-8")
    (workspace / "inside").symlink_to("sub")
    ctx = ExecutionContext(workspace=workspace, call_id="t", timeout=10, output_limit=10_000)
    listed = str(list_directory.TOOL.execute(ctx, {"path": "."})).splitlines()[1:]
    assert listed == ["inside/", "not-there", "sub/", "there"], listed
