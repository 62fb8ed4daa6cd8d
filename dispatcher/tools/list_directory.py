"""list_directory: the entries of one workspace directory."""

from __future__ import annotations

from typing import Any

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
    if not path.exists():
        raise ToolError(
            f"Directory '{relative}' does not exist. Use list_directory on '.' to start "
            "from the workspace root."
        )
    if not path.is_dir():
        raise ToolError(f"'{relative}' is a file, not a directory. Use read_file to read it.")
    names = sorted(f"{entry.name}/" if entry.is_dir() else entry.name for entry in path.iterdir())
    if not names:
        return f"{relative} (empty directory)"
    lines = [f"{relative} ({len(names)} entries)", *names[:MAX_ENTRIES]]
    if len(names) > MAX_ENTRIES:
        lines.append(f"[truncated: {len(names) - MAX_ENTRIES} more entries; list a subdirectory]")
    return cap_text("\n".join(lines), ctx.output_limit, "list a subdirectory")


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
