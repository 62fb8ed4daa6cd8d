"""Red team: what a refused path says never names a path outside the workspace that only
Harness could have found. Harness resolves an agent's path as root (the guard, then each
file tool), following every symlink, also those of trees the agent's sandbox never shows;
when that resolve meets a symlink loop, Python's message names the path it had reached."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.tools import read_file
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
    assert said is not None and "cannot be resolved" in said, said
    assert "private" not in said, said
    ctx = ExecutionContext(workspace=workspace, call_id="t", timeout=10, output_limit=10_000)
    with pytest.raises(ToolError) as refused:
        read_file.TOOL.execute(ctx, {"path": "a/x"})
    assert "private" not in str(refused.value), refused.value
