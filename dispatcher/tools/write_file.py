"""write_file: create or overwrite a text file of the workspace."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from dispatcher.tools._paths import path_violation, resolve_in_workspace
from dispatcher.tools.base import ExecutionContext, Tool, ToolError


def write_file(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """Write `content` (UTF-8) to `path`, creating parent directories.

    Returns "Wrote N bytes to path". Raises ToolError when the path is a directory or a
    parent cannot be created.
    """
    relative = args["path"]
    path = resolve_in_workspace(ctx.workspace, relative)
    if path.is_dir():
        raise ToolError(f"'{relative}' is a directory; give a file path to write to.")
    data = args["content"].encode("utf-8")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as error:
        raise ToolError(f"Could not write '{relative}': {error.strerror or error}.") from error
    return f"Wrote {len(data)} bytes to {relative}"


def present_write(arguments: dict[str, Any], workspace: Path) -> dict[str, Any]:
    """What a reviewer sees: a unified diff of the current file against the new content.

    Never reads a file outside the workspace: for such a path the diff is against empty.
    """
    relative = str(arguments.get("path", ""))
    content = str(arguments.get("content", ""))
    current = _current_text(relative, workspace)
    new_file = current is None
    diff = difflib.unified_diff(
        (current or "").splitlines(keepends=True),
        content.splitlines(keepends=True),
        fromfile="/dev/null" if new_file else f"a/{relative}",
        tofile=f"b/{relative}",
    )
    return {"kind": "diff", "path": relative, "diff": "".join(diff), "new_file": new_file}


DIFF_LIMIT = 1024 * 1024  # bytes of the current file read for the reviewer's diff


def _current_text(relative: str, workspace: Path) -> str | None:
    """The file's current text, or None when there is no readable file inside the workspace."""
    if path_violation(relative, workspace) is not None:
        return None
    path = (workspace.resolve() / relative).resolve(strict=False)
    try:
        if not path.is_file():
            return None
        size = path.stat().st_size
        if size > DIFF_LIMIT:
            return f"[the current file is {size} bytes, too large to diff; it will be replaced]\n"
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:  # unreadable: the reviewer sees the write as if the file were new
        return None


TOOL = Tool(
    name="write_file",
    description=(
        "Create or overwrite a text file in the workspace with `content` (UTF-8). "
        "`path` is relative to the workspace; missing parent directories are created."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path relative to the workspace."},
            "content": {"type": "string", "description": "The complete new file content."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    },
    execute=write_file,
    present_call=present_write,
    path_arguments=("path",),
)
