"""list_directory: the entries of one workspace directory."""

from __future__ import annotations

import os
import posixpath
import stat
from pathlib import Path
from typing import Any

from dispatcher.tools._confined import READ, changed, changed_message, opened
from dispatcher.tools._paths import cap_text, resolve_in_workspace
from dispatcher.tools.base import ExecutionContext, Tool, ToolError

MAX_ENTRIES = 1000


def list_directory(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """Sorted entry names, directories with a trailing "/", after a header.

    At most MAX_ENTRIES entries and ctx.output_limit characters. Raises ToolError for a
    missing path or a file.
    """
    relative = args.get("path", ".")
    path = resolve_in_workspace(ctx.workspace, relative)
    try:
        names = _entry_names(ctx.workspace, path, relative)
    except (FileNotFoundError, NotADirectoryError) as error:
        raise ToolError(
            f"Directory '{relative}' does not exist. Use list_directory on '.' to start "
            "from the workspace root."
        ) from error
    except OSError as error:
        if changed(error):
            raise ToolError(changed_message(relative)) from error
        raise ToolError(f"Could not list '{relative}': {error.strerror or error}.") from error
    if not names:
        return f"{relative} (empty directory)"
    lines = [f"{relative} ({len(names)} entries)", *names[:MAX_ENTRIES]]
    if len(names) > MAX_ENTRIES:
        lines.append(f"[truncated: {len(names) - MAX_ENTRIES} more entries; list a subdirectory]")
    return cap_text("\n".join(lines), ctx.output_limit, "list a subdirectory")


def _entry_names(workspace: Path, path: Path, relative: str) -> list[str]:
    """Sorted names, read through a descriptor opened with no symlink followed."""
    with opened(workspace, path, READ) as fd:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            raise ToolError(f"'{relative}' is a file, not a directory. Use read_file to read it.")
        with os.scandir(fd) as entries:
            return sorted(_shown(workspace, relative, entry) for entry in entries)


def _shown(workspace: Path, relative: str, entry: os.DirEntry[str]) -> str:
    """An entry's name, with "/" for a directory. A symlink is followed only when it
    resolves inside the workspace (Harness lists as root: a link to a path outside, which
    the agent's sandbox never shows, answered whether a directory is there, an agent's
    probe of the host's and other agents' directories)."""
    if not entry.is_symlink():
        return f"{entry.name}/" if entry.is_dir(follow_symlinks=False) else entry.name
    try:
        target = resolve_in_workspace(workspace, posixpath.join(relative, entry.name))
        with opened(workspace, target, os.O_PATH) as fd:
            is_directory = stat.S_ISDIR(os.fstat(fd).st_mode)
    except (ToolError, OSError):  # outside, nowhere, or changed meanwhile: as it is
        return entry.name
    return f"{entry.name}/" if is_directory else entry.name


TOOL = Tool(
    name="list_directory",
    description=(
        "List the entries of a directory in the workspace, sorted by name; directories "
        "end with '/'. `path` is relative to the workspace and defaults to '.'."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "default": ".",
                "description": "Directory path relative to the workspace.",
            },
        },
        "additionalProperties": False,
    },
    execute=list_directory,
    read_only=True,
    is_concurrency_safe=True,
    path_arguments=("path",),
)
