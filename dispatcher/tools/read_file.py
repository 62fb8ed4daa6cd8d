"""read_file: read a UTF-8 text file of the workspace, optionally a window of its lines."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from dispatcher.tools._confined import READ, changed, changed_message, opened, read_at_most
from dispatcher.tools._paths import cap_text, looks_binary, resolve_in_workspace
from dispatcher.tools.base import ExecutionContext, Tool, ToolError

MAX_BYTES = 20 * 1024 * 1024


def read_file(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """The file's text (or lines offset..offset+limit-1) after a one-line header.

    Capped to ctx.output_limit characters with a truncation note. Raises ToolError for
    a missing file, a directory, a file over MAX_BYTES, or a binary / non-UTF-8 file.
    """
    relative = args["path"]
    path = resolve_in_workspace(ctx.workspace, relative)
    text = _read_text(ctx.workspace, path, relative)
    lines = text.splitlines(keepends=True)
    offset = args.get("offset", 1)
    limit = args.get("limit")
    if lines and offset > len(lines):
        raise ToolError(
            f"offset {offset} is past the end of '{relative}' ({len(lines)} lines). "
            "Use a smaller offset."
        )
    window = lines[offset - 1 : offset - 1 + limit if limit else None]
    if not lines:
        header = f"{relative} (empty file)\n"
    else:
        last = offset - 1 + len(window)
        header = f"{relative} (lines {offset}-{last} of {len(lines)})\n"
    return cap_text(header + "".join(window), ctx.output_limit, "use offset/limit")


def _read_text(workspace: Path, path: Path, relative: str) -> str:
    """The file's text, read through a descriptor opened with no symlink followed."""
    try:
        with opened(workspace, path, READ) as fd:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise ToolError(f"'{relative}' is a directory. Use list_directory to list it.")
            if not stat.S_ISREG(info.st_mode):
                raise ToolError(f"'{relative}' is not a regular file; read_file reads files.")
            if info.st_size > MAX_BYTES:
                raise ToolError(_too_large(relative, info.st_size))
            data = read_at_most(fd, MAX_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError) as error:
        raise ToolError(
            f"File '{relative}' does not exist. Use list_directory to see which files exist."
        ) from error
    except OSError as error:
        raise ToolError(_os_problem(relative, error)) from error
    if len(data) > MAX_BYTES:  # it grew after fstat
        raise ToolError(_too_large(relative, len(data)))
    if looks_binary(data[:8192]):
        raise ToolError(f"'{relative}' is a binary file; read_file only reads UTF-8 text.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ToolError(
            f"'{relative}' is not UTF-8 text ({error.reason} at byte {error.start}); "
            "read_file only reads UTF-8 text."
        ) from error


def _too_large(relative: str, size: int) -> str:
    return (
        f"'{relative}' is {size} bytes; read_file reads files up to {MAX_BYTES} bytes. "
        "Use search_files to find the lines you need."
    )


def _os_problem(relative: str, error: OSError) -> str:
    if changed(error):
        return changed_message(relative)
    return f"Could not read '{relative}': {error.strerror or error}."


TOOL = Tool(
    name="read_file",
    description=(
        "Read a UTF-8 text file in the workspace. `path` is relative to the workspace. "
        "Optionally pass `offset` (first line, 1-based) and `limit` (number of lines) "
        "to read part of a long file. Long output is truncated with a note."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path relative to the workspace."},
            "offset": {"type": "integer", "minimum": 1, "description": "First line, 1-based."},
            "limit": {"type": "integer", "minimum": 1, "description": "Number of lines."},
        },
        "required": ["path"],
        "additionalProperties": False,
    },
    execute=read_file,
    read_only=True,
    is_concurrency_safe=True,
    path_arguments=("path",),
)
