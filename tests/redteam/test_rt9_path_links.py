"""Red team rt9: path_violation's absolute link targets (45569da) are compared with the
workspace's path by text. A link a program wrote as `//WS/src` or `WS/./src` (a build
tool's `$(CURDIR)/` joined with `/src`) is the workspace's own directory to the kernel
and was accepted before; it was refused as "outside". A target that only shares a string
prefix with the workspace (`/ws` and `/ws2`) or passes through `..` stays refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.tools import read_file, search_files, write_file
from dispatcher.tools._paths import path_violation
from dispatcher.tools.base import ExecutionContext, ToolError

pytestmark = pytest.mark.backend_independent


def test_an_absolute_link_spelled_with_extra_slashes_or_dots_reaches_the_workspace(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "app.py").write_text("print('own')\n")
    text = str(workspace)
    (workspace / "doubled").symlink_to("/" + text)  # //tmp/.../ws
    (workspace / "dotted").symlink_to(text.replace("/ws", "/./ws") + "//src")
    ctx = ExecutionContext(workspace=workspace, call_id="rt9", timeout=10, output_limit=10_000)
    for path in ("doubled/src/app.py", "dotted/app.py"):
        assert path_violation(path, workspace) is None, path
        assert "print('own')" in str(read_file.TOOL.execute(ctx, {"path": path}))
    write_file.TOOL.execute(ctx, {"path": "dotted/new.py", "content": "x = 1\n"})
    assert (workspace / "src" / "new.py").read_text() == "x = 1\n"


def test_a_target_sharing_only_a_string_prefix_or_passing_through_dotdot_is_refused(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    beside = tmp_path / "ws2"
    beside.mkdir()
    (beside / "secret").write_text("the person's\n")
    (workspace / "prefix").symlink_to(str(beside))
    (workspace / "prefix_slashes").symlink_to("/" + str(beside) + "/")
    (workspace / "through").symlink_to(f"{beside}/../ws")
    (workspace / "up").symlink_to(f"{workspace}/../ws2")
    ctx = ExecutionContext(workspace=workspace, call_id="rt9", timeout=10, output_limit=10_000)
    for path in ("prefix/secret", "prefix_slashes/secret", "through/x", "up/secret"):
        assert "resolves outside the session workspace" in str(path_violation(path, workspace))
        with pytest.raises(ToolError, match="outside the session workspace"):
            read_file.TOOL.execute(ctx, {"path": path})
    assert (beside / "secret").read_text() == "the person's\n"


def searched(tmp_path: Path, x_is_a_link: bool) -> str:
    """search_files over a workspace whose links pass through X beside it on the host (a
    directory, or a link to another tree: what the agent must not learn)."""
    (tmp_path / "elsewhere" / "deeper").mkdir(parents=True)
    if x_is_a_link:
        (tmp_path / "X").symlink_to(tmp_path / "elsewhere" / "deeper")
    else:
        (tmp_path / "X").mkdir()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "file").write_text("needle in the agent's own\n")
    (workspace / "probe").symlink_to("../X/../ws/file")
    (workspace / "absolute").symlink_to(f"{tmp_path}/X/../ws/file")
    (workspace / "inside").symlink_to("file")
    ctx = ExecutionContext(workspace=workspace, call_id="rt9", timeout=10, output_limit=10_000)
    return str(search_files.TOOL.execute(ctx, {"pattern": "needle"}))


def test_search_files_gives_one_answer_whatever_the_host_holds_beside_the_workspace(
    tmp_path: Path,
) -> None:
    """search_files followed a file symlink with Path.resolve (as root, through the host):
    with X a directory `probe` and `absolute` were searched and listed, with X a link they
    were not, so the agent learnt what X is. Links are now followed as path_violation
    follows them, inside the workspace only: a link inside is searched, one that steps
    outside never is, on both hosts."""
    as_directory = searched(tmp_path / "one", x_is_a_link=False)
    as_link = searched(tmp_path / "two", x_is_a_link=True)
    assert as_directory == as_link
    assert "inside" in as_directory and "file" in as_directory
    assert "probe" not in as_directory and "absolute" not in as_directory
