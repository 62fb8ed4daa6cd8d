"""path_violation looks only inside the workspace: an agent-written link that leaves it and
would come back (`probe -> ../X/../ws/file`) is refused whatever the host holds outside, so
the answer never tells the agent whether X, outside its sandbox, is a directory or a link
(Harness resolved such links as root, where the agent's sandbox shows nothing)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatcher.tools import read_file, write_file
from dispatcher.tools._paths import path_violation
from dispatcher.tools.base import ExecutionContext, ToolError

pytestmark = pytest.mark.backend_independent


def host(tmp_path: Path, x_is_a_link: bool) -> Path:
    """A host with the workspace `ws` beside `X`, a directory or a link to another tree
    (what the agent must not learn), and links the agent wrote that pass through X."""
    (tmp_path / "elsewhere" / "deeper").mkdir(parents=True)
    if x_is_a_link:
        (tmp_path / "X").symlink_to(tmp_path / "elsewhere" / "deeper")
    else:
        (tmp_path / "X").mkdir()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "file").write_text("the agent's own\n")
    (workspace / "probe").symlink_to("../X/../ws/file")
    (workspace / "absolute").symlink_to(f"{tmp_path}/X/../ws/file")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "deep").symlink_to("../../X/../ws/sub")
    return workspace


def answers(workspace: Path) -> list[str]:
    """What the agent is told for each probe: the guard's answer and the tools' answers
    (the workspace's own path, which differs between the two hosts, written as WS)."""
    told = []
    ctx = ExecutionContext(workspace=workspace, call_id="o", timeout=10, output_limit=10_000)
    for path in ("probe", "absolute", "sub/deep/x", "../ws/file", "sub/../../ws/file"):
        told.append(str(path_violation(path, workspace)))
        for tool, args in (
            (read_file.TOOL, {"path": path}),
            (write_file.TOOL, {"path": path, "content": "x"}),
        ):
            try:
                told.append(str(tool.execute(ctx, args)))
            except ToolError as error:
                told.append(str(error))
    return [answer.replace(str(workspace.resolve()), "WS") for answer in told]


def test_links_through_a_host_directory_get_one_answer_whatever_it_is(tmp_path: Path) -> None:
    """Before the fix, with X a directory the probes read the agent's own file, and with X
    a link they were refused as leaving the workspace: a host-structure oracle. Now both
    hosts give the same answers: each probe steps above the workspace and is refused."""
    as_directory = answers(host(tmp_path / "one", x_is_a_link=False))
    as_link = answers(host(tmp_path / "two", x_is_a_link=True))
    assert as_directory == as_link
    assert all("outside the session workspace" in answer for answer in as_directory)
    assert not (tmp_path / "one" / "X" / "x").exists()


def test_links_inside_the_workspace_still_resolve(tmp_path: Path) -> None:
    """Relative and absolute links that stay inside, a link to the workspace's path as it
    was given (through a link of the operator's), paths that do not exist yet."""
    real = tmp_path / "real"
    (real / "src").mkdir(parents=True)
    (real / "src" / "a.py").write_text("a\n")
    given = tmp_path / "given"
    given.symlink_to(real)
    (real / "rel").symlink_to("src/a.py")
    (real / "abs").symlink_to(real / "src" / "a.py")
    (real / "by-given").symlink_to(given / "src")
    (real / "updown").symlink_to("src/../src")
    inside = ["rel", "abs", "by-given/a.py", "updown/a.py", "src/new/b.py", "x/../src/a.py"]
    workspace = given
    if os.geteuid() != 0:
        # Unprivileged, every directory the test can make is Harness's own user's to
        # write, as sandboxed programs write then: the operator's link could be theirs, so
        # a workspace reached through it is refused, and a link leading through it too.
        assert "changed while this path was checked" in str(path_violation("rel", given))
        workspace = real
        assert path_violation("by-given/a.py", workspace) is not None
        inside.remove("by-given/a.py")
    for path in inside:
        assert path_violation(path, workspace) is None, path
    assert path_violation("src/..", workspace) is None
    assert path_violation("src/../..", workspace) is not None
    (real / "loop").symlink_to("loop")
    assert "symlink loop" in str(path_violation("loop/x", workspace))
