"""delete_file: remove one file (never a directory) from the workspace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dispatcher.tools._paths import resolve_in_workspace
from dispatcher.tools.base import ExecutionContext, Tool, ToolError


def delete_file(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """Delete the file at `path`; a symlink inside the workspace is removed, not its target.

    Raises ToolError for a missing path or a directory.
    """
    relative = args["path"]
    target = resolve_in_workspace(ctx.workspace, relative)
    link = _symlink_at(ctx.workspace, relative)
    if link is None and not target.exists():
        raise ToolError(
            f"File '{relative}' does not exist. Use list_directory to see which files exist."
        )
    if link is None and target.is_dir():
        raise ToolError(f"'{relative}' is a directory; delete_file only deletes files.")
    try:
        (link or target).unlink()
    except OSError as error:
        raise ToolError(f"Could not delete '{relative}': {error.strerror or error}.") from error
    return f"Deleted {relative}"


def _symlink_at(workspace: Path, relative: str) -> Path | None:
    """The symlink named by `relative` itself (its parent resolved inside), or None."""
    name = Path(relative).name
    if name in ("", ".", ".."):
        return None
    parent = resolve_in_workspace(workspace, str(Path(relative).parent))
    candidate = parent / name
    return candidate if candidate.is_symlink() else None


TOOL = Tool(
    name="delete_file",
    description=(
        "Delete one file in the workspace. `path` is relative to the workspace. "
        "Directories are never deleted by this tool."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path relative to the workspace."},
        },
        "required": ["path"],
        "additionalProperties": False,
    },
    execute=delete_file,
    destructive=True,
    path_arguments=("path",),
)
