"""delete_file: remove one file (never a directory) from the workspace."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from dispatcher.tools._confined import changed, changed_message, directory_beneath
from dispatcher.tools._paths import resolve_in_workspace
from dispatcher.tools.base import ExecutionContext, Tool, ToolError


def delete_file(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """Delete the file at `path`; a symlink inside the workspace is removed, not its target.

    Raises ToolError for a missing path or a directory. The entry is looked at and
    unlinked relative to a descriptor of its directory, opened with no symlink followed
    (`_confined`): a workspace changing under the tool never makes it delete elsewhere.
    """
    relative = args["path"]
    target = resolve_in_workspace(ctx.workspace, relative)  # refuses a link leading outside
    parent, name = _entry(ctx.workspace, relative, target)
    try:
        with directory_beneath(ctx.workspace, parent) as directory:
            if stat.S_ISDIR(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), relative)
            os.unlink(name, dir_fd=directory)
    except (FileNotFoundError, NotADirectoryError) as error:
        raise ToolError(
            f"File '{relative}' does not exist. Use list_directory to see which files exist."
        ) from error
    except IsADirectoryError as error:
        raise ToolError(f"'{relative}' is a directory; delete_file only deletes files.") from error
    except OSError as error:
        if changed(error):
            raise ToolError(changed_message(relative)) from error
        raise ToolError(f"Could not delete '{relative}': {error.strerror or error}.") from error
    return f"Deleted {relative}"


def _entry(workspace: Path, relative: str, target: Path) -> tuple[Path, str]:
    """The resolved directory holding the entry `relative` names, and the entry's name.

    The name itself is not resolved: a symlink is deleted, not what it points to.
    """
    name = Path(relative).name
    if name in ("", ".", ".."):  # '.', 'a/..': the path names a directory
        if target == workspace.resolve():
            raise ToolError(f"'{relative}' is a directory; delete_file only deletes files.")
        return target.parent, target.name
    return resolve_in_workspace(workspace, str(Path(relative).parent)), name


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
