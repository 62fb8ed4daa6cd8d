"""Red team rt9: delete_file after 5dfa87e. Every spelling of a directory (`a/./`,
`a/.//`, `a/..`, `/.`, `.`, ``) is refused and nothing is removed, a `...` file is an
ordinary file, a trailing slash never reaches a directory or the workspace; and a path
that is not a string gets the other file tools' answer, a ToolError (it raised a bare
AttributeError from the new text check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.tools import delete_file
from dispatcher.tools.base import ExecutionContext, ToolError

pytestmark = pytest.mark.backend_independent


def tree(tmp_path: Path) -> tuple[Path, ExecutionContext]:
    workspace = tmp_path / "ws"
    (workspace / "a" / "b").mkdir(parents=True)
    (workspace / "a" / "f").write_text("f\n")
    (workspace / "...").write_text("dots\n")
    (tmp_path / "outside").write_text("the person's\n")
    (workspace / "a" / "dirlink").symlink_to("b")
    ctx = ExecutionContext(workspace=workspace, call_id="rt9", timeout=10, output_limit=10_000)
    return workspace, ctx


def snapshot(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


@pytest.mark.parametrize(
    "path",
    ["a/./", "a/.//", "a/.", "a/..", "a/b/../..", ".", "./", "", "/", "/.", "//..", "a/b/"],
)
def test_no_spelling_of_a_directory_deletes_anything(tmp_path: Path, path: str) -> None:
    workspace, ctx = tree(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(ToolError):
        delete_file.TOOL.execute(ctx, {"path": path})
    assert snapshot(tmp_path) == before
    assert workspace.is_dir()


def test_three_dots_and_a_link_to_a_directory_are_entries_of_their_own(tmp_path: Path) -> None:
    workspace, ctx = tree(tmp_path)
    assert delete_file.TOOL.execute(ctx, {"path": "..."}) == "Deleted ..."
    assert not (workspace / "...").exists()
    delete_file.TOOL.execute(ctx, {"path": "a/dirlink/"})  # the link, never its directory
    assert not (workspace / "a" / "dirlink").is_symlink()
    assert (workspace / "a" / "b").is_dir()
    assert (tmp_path / "outside").read_text() == "the person's\n"


@pytest.mark.parametrize("path", [5, None, ["a/f"], {"p": "a/f"}])
def test_a_path_that_is_not_a_string_is_a_tool_error(tmp_path: Path, path: object) -> None:
    workspace, ctx = tree(tmp_path)
    with pytest.raises(ToolError, match="Path must be a string"):
        delete_file.TOOL.execute(ctx, {"path": path})
    assert (workspace / "a" / "f").exists()
