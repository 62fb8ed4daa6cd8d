"""delete_file: remove one file (never a directory) from the workspace."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from dispatcher.tools import sandbox_git, write_file
from dispatcher.tools._confined import changed, changed_message, directory_beneath
from dispatcher.tools._paths import resolve_in_workspace
from dispatcher.tools.base import ExecutionContext, Tool, ToolError, default_present_call


def delete_file(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """Delete the file at `path`; a symlink inside the workspace is removed, not its target.

    Raises ToolError (never a bare OSError) for a path ending in '.' or '..', a missing
    path, a directory, or a workspace that changed while it was used. The entry is looked
    at and unlinked relative to a descriptor of its directory, opened with no symlink
    followed (`_confined`): a workspace changing under the tool never makes it delete
    elsewhere.
    """
    relative = args["path"]
    if not isinstance(relative, str):  # (validated before: the other tools' answer)
        resolve_in_workspace(ctx.workspace, relative)
    if _names_a_directory(relative):
        raise ToolError(
            f"Refusing to delete {relative!r}: a path ending in '.' or '..' names a "
            "directory, and delete_file only deletes files. Name the file itself, e.g. "
            "'src/old.py'."
        )
    if ctx.git_guard != sandbox_git.NONE and (why := git_refusal(ctx.workspace, relative)):
        raise ToolError(why)
    try:
        resolve_in_workspace(ctx.workspace, relative)  # refuses a link leading outside
        parent = resolve_in_workspace(ctx.workspace, str(Path(relative).parent))
        with directory_beneath(ctx.workspace, parent) as directory:
            name = Path(relative).name  # not resolved: a symlink is deleted, not its target
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
        # A symlink flipped onto the path while it was used (changed), or any other error
        # of the race (EINVAL from a readlink of what stopped being a link): a tool error.
        if changed(error) or error.errno == errno.EINVAL:
            raise ToolError(changed_message(relative)) from error
        raise ToolError(f"Could not delete '{relative}': {error.strerror or error}.") from error
    return f"Deleted {relative}"


def git_refusal(workspace: Path, relative: str) -> str | None:
    """Why deleting `relative` is refused to a call no person approved, the message the
    model reads, or None: git metadata the sandbox keeps read-only for a command no
    person approved (`sandbox_git.guarded_path`: a hook, the configuration;
    `sandbox_git.hook_refusal`: a `core.hooksPath` directory's hook, a linked hook's
    target), by the name given or with its directory resolved. delete_file runs outside
    the sandbox: an allowed one removed the person's `.git/hooks/pre-commit` (a secret
    scanner, a lint gate), which their next commit then did not run."""
    try:
        parent = resolve_in_workspace(workspace, str(Path(relative).parent))
        resolved: Path | None = parent / Path(relative).name
    except (ToolError, OSError, RuntimeError, ValueError):
        resolved = None  # (the name given is judged all the same)
    why = sandbox_git.hook_refusal(workspace, relative, resolved, deleting=True)
    names = sandbox_git.names_of(workspace, relative, resolved)
    if why is None and any(sandbox_git.guarded_path(name) for name in names):
        why = sandbox_git.DELETE_REFUSED.format(relative=relative)
    return why


def present_delete(arguments: dict[str, Any], workspace: Path) -> dict[str, Any]:
    """What a reviewer sees: the arguments, and what git would no longer run or read
    (`git_refusal` as the workspace is now: the approval binds that too)."""
    why = git_refusal(workspace, str(arguments.get("path", "")))
    shown = default_present_call(arguments, workspace)
    return {**shown, "git_metadata": why} if why is not None else shown


def changed_since(
    arguments: dict[str, Any], workspace: Path, presentation: dict[str, Any]
) -> str | None:
    """Why an approved delete may not run as approved: the file became git metadata
    since the ask, which its reviewer was not shown (write_file.became_git_metadata: a
    `core.hooksPath` set meanwhile made `.husky/pre-commit` the person's hook)."""
    now = git_refusal(workspace, str(arguments.get("path", "")))
    return write_file.became_git_metadata(now, arguments, presentation)


def _names_a_directory(relative: str) -> bool:
    """True when `relative`'s last component is '.' or '..' (or there is none): read on
    the text as given, since pathlib folds 'a/.' into 'a'. Such a path names a directory
    whatever the disk holds, so it is refused before anything is resolved."""
    last = relative.rstrip("/").rsplit("/", 1)[-1]
    return last in ("", ".", "..")


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
    present_call=present_delete,
    changed_since=changed_since,
    destructive=True,
    path_arguments=("path",),
)
