"""write_file: create or overwrite a text file of the workspace."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from dispatcher.tools import sandbox, sandbox_git
from dispatcher.tools._confined import (
    READ,
    changed,
    changed_message,
    directory_beneath,
    opened,
    write_all,
)
from dispatcher.tools._paths import resolve_in_workspace
from dispatcher.tools.base import ExecutionContext, Tool, ToolError
from dispatcher.tools.diffs import newline_lines, unified_diff


def write_file(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """Write `content` (UTF-8) to `path`, creating parent directories.

    Returns "Wrote N bytes to path". Raises ToolError when the path is a directory, a
    parent cannot be created, or the file has another name (a hard link: the write would
    change a path the rules and the reviewer's diff never named; nothing is written). Parents and the file are made and opened through
    descriptors with no symlink followed (`_confined`), so a workspace changing under
    the tool can make it fail but never write elsewhere.
    """
    relative = args["path"]
    path = resolve_in_workspace(ctx.workspace, relative)
    if ctx.git_guard != sandbox_git.NONE and (why := git_refusal(ctx.workspace, relative, path)):
        raise ToolError(why)
    data = args["content"].encode("utf-8")
    try:
        _write(ctx.workspace, path, data)
    except IsADirectoryError as error:
        raise ToolError(f"'{relative}' is a directory; give a file path to write to.") from error
    except HardLinked as error:
        raise ToolError(
            f"'{relative}' is a hard link: the same file has another name in the workspace, "
            "which this write would change too. Nothing was written. Delete it first "
            "(delete_file removes this name only), then write it."
        ) from error
    except OSError as error:
        if changed(error):
            raise ToolError(changed_message(relative)) from error
        raise ToolError(f"Could not write '{relative}': {error.strerror or error}.") from error
    return f"Wrote {len(data)} bytes to {relative}"


def _git_metadata(workspace: Path, relative: str, path: Path) -> bool:
    """Whether the write would change what the sandbox keeps read-only for a command no
    person approved (sandbox_git.guarded_path), by the name given or the name resolved
    (`meta/config`, `meta` a link to `.git`), or what git reads of a directory that is,
    or becomes by this write, a git directory to git (`sandbox_git.in_git_directory`: a
    bare repository in the work tree, `src/HEAD` beside `src/objects/` and `src/refs/`). The file tools write outside the sandbox,
    so its binds do not hold them: a rule or mode allowing write_file must not plant a
    hook either."""
    if sandbox_git.guarded_path(relative.replace(os.sep, "/")):
        return True
    try:
        inside = path.relative_to(workspace.resolve())
    except (OSError, RuntimeError, ValueError):
        return True  # (unsure: as if it were)
    return sandbox_git.guarded_path(inside.as_posix()) or sandbox_git.in_git_directory(
        workspace.resolve(), inside.as_posix()
    )


def git_refusal(workspace: Path, relative: str, path: Path) -> str | None:
    """Why a write of `relative` (resolved: `path`) is refused to a call no person
    approved, the message the model reads, or None: git metadata, in a `.git` or a git
    directory of the work tree (`_git_metadata`), or a hook outside them
    (`sandbox_git.hook_refusal`: husky's `.husky/pre-commit`, a hook link's target)."""
    if _git_metadata(workspace, relative, path):
        return (
            f"'{relative}' is git metadata that makes git run programs (a hook, the "
            "configuration, the index): written here, a person's next git command in the "
            "workspace would run what it says. Nothing was written. A call a reviewer "
            "approves may write it."
        )
    return sandbox_git.hook_refusal(workspace, relative, path)


# No O_TRUNC: the file is truncated only once it is known to be a regular file with no
# other name (a hard link elsewhere in the workspace would be written through).
WRITE = os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


class HardLinked(OSError):
    """The file has another name: writing it would change a path no rule or diff named."""


def _write(workspace: Path, path: Path, data: bytes) -> None:
    if path == workspace.resolve():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    with directory_beneath(workspace, path.parent, create=True) as parent:
        fd = os.open(path.name, WRITE, 0o666, dir_fd=parent)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if info.st_nlink > 1:
            raise HardLinked(errno.EMLINK, "the file has another name", str(path))
        sandbox.hand_over(fd)  # Harness as root: sandboxed programs may change it too
        os.ftruncate(fd, 0)
        write_all(fd, data)
    finally:
        os.close(fd)


def present_write(arguments: dict[str, Any], workspace: Path) -> dict[str, Any]:
    """What a reviewer sees: a unified diff of the current file against the new content.

    Never reads a file outside the workspace: for such a path the diff is against empty.
    """
    relative = str(arguments.get("path", ""))
    content = str(arguments.get("content", ""))
    # The diff and the hash the approval binds from one read of one open file: read
    # twice, a file changing in between (admission holds no workspace lock) bound the
    # approval to content the diff never showed.
    current, sha256_before, file_before = _current(relative, workspace)
    new_file = current is None
    diff = unified_diff(  # (bounded in time: dispatcher.tools.diffs)
        newline_lines(current or ""),
        newline_lines(content),
        fromfile="/dev/null" if new_file else f"a/{relative}",
        tofile=f"b/{relative}",
    )
    why = refusal_now(arguments, workspace)
    return {
        "kind": "diff",
        "path": relative,
        "diff": "".join(diff),
        "new_file": new_file,
        # what the diff was made against, which the approval binds (`changed_since`)
        "sha256_before": sha256_before,
        **({"file_before": file_before} if file_before is not None else {}),
        # what git would run or read of it, shown: the approval binds that too
        **({"git_metadata": why} if why is not None else {}),
    }


def refusal_now(arguments: dict[str, Any], workspace: Path) -> str | None:
    """`git_refusal` of the call's path as the workspace is now (None when the path
    cannot be resolved: the write fails on that)."""
    relative = str(arguments.get("path", ""))
    try:
        path = resolve_in_workspace(workspace, relative)
    except ToolError:
        return None
    return git_refusal(workspace, relative, path)


def bound_before(presentation: dict[str, Any]) -> tuple[Any, Any]:
    """What an ask's presentation binds of the file it would overwrite: its SHA-256, or
    for a file past HASH_LIMIT its identity (`file_before`); (None, None) for no file."""
    return presentation.get("sha256_before"), presentation.get("file_before")


def changed_since(
    arguments: dict[str, Any], workspace: Path, presentation: dict[str, Any]
) -> str | None:
    """Why the file is no longer the one the approved diff was made against, or None (an
    ask recorded before the diff carried its file's hash: nothing to compare). Also when
    the file became git metadata since (`became_git_metadata`)."""
    became = became_git_metadata(refusal_now(arguments, workspace), arguments, presentation)
    if became is not None:
        return became
    if "sha256_before" not in presentation:
        return None
    relative = str(arguments.get("path", ""))
    _, sha256_now, file_now = _current(relative, workspace)
    if (sha256_now, file_now) != bound_before(presentation):
        return f"{relative} changed since the reviewer's diff was made"
    return None


def became_git_metadata(
    now: str | None, arguments: dict[str, Any], presentation: dict[str, Any]
) -> str | None:
    """Why an approved file tool's call may not run as approved: its path is git metadata
    now (`now`, the tool's refusal to a call no person approved, as the workspace is:
    a hook of a `core.hooksPath` set since), and the reviewer was not shown that (the
    ask's `git_metadata`, none in an ask recorded before it was kept). An approved call
    runs with no git guard (execution.git_guard): an approval of `.husky/pre-commit`
    given before a command approved meanwhile set `core.hooksPath` to `.husky` had the
    person's next commit run the agent's code. Asked again, the reviewer is shown it."""
    if now is None or now == presentation.get("git_metadata"):
        return None
    relative = str(arguments.get("path", ""))
    return (
        f"'{relative}' is now git metadata that makes git run programs (a hook, a "
        "configuration git reads), which the reviewer was not shown"
    )


DIFF_LIMIT = 1024 * 1024  # bytes of the current file read for the reviewer's diff
# Past this size a file is bound by its identity, not hashed: an ask (and its check
# before the write) would otherwise read the whole of any file an agent names, in the web
# process, as often as it asks. Such a file is past DIFF_LIMIT too, so the reviewer was
# shown no content of it, only that it will be replaced.
HASH_LIMIT = 64 * 1024 * 1024


def identity(info: os.stat_result) -> dict[str, int]:
    """A file past HASH_LIMIT as its ask binds it. Its change time (ctime) is set by the
    kernel at every change of its content or metadata, and no program can set it back
    (utimensat sets only the access and modification times); a new file under the name
    has a new inode or a new ctime. No device number: the web process that asks and the
    worker that checks may be other hosts sharing the workspace, and each numbers its
    mounts for itself."""
    return {
        "inode": info.st_ino,
        "size": info.st_size,
        "mtime_ns": info.st_mtime_ns,
        "ctime_ns": info.st_ctime_ns,
    }


def _current(
    relative: str, workspace: Path
) -> tuple[str | None, str | None, dict[str, int] | None]:
    """(The file's current text, the SHA-256 of the whole file, None), all of one read
    through one descriptor; for a file past HASH_LIMIT (text, None, its `identity`),
    read no further than its size; (None, None, None) when there is no readable regular
    file inside the workspace. The text is a note past DIFF_LIMIT bytes.

    Read through a descriptor opened with no symlink followed (this runs in the web
    process, and the text lands in the reviewer's diff and the audit payload).
    """
    try:
        path = resolve_in_workspace(workspace, relative)
    except ToolError:
        return None, None, None
    try:
        with opened(workspace, path, READ) as fd:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return None, None, None
            if info.st_size > HASH_LIMIT:
                note = _too_large(info.st_size)
                return note, None, identity(info)
            digest = hashlib.sha256()
            head = bytearray()
            read = 0
            while chunk := os.read(fd, 1 << 20):
                read += len(chunk)
                if read > HASH_LIMIT:  # grown since its size was read
                    return _too_large(read), None, identity(os.fstat(fd))
                digest.update(chunk)
                if len(head) <= DIFF_LIMIT:
                    head += chunk[: DIFF_LIMIT + 1 - len(head)]
    except OSError:  # unreadable, or changed: the reviewer sees the write as if it were new
        return None, None, None
    if len(head) > DIFF_LIMIT:
        text = _too_large(max(info.st_size, read))
    else:
        # A NUL shown escaped: PostgreSQL keeps none in the ask's presentation (jsonb),
        # and a write over a binary file refused its whole message.
        text = bytes(head).decode("utf-8", errors="replace").replace("\x00", "\\x00")
    return text, digest.hexdigest(), None


def _too_large(size: int) -> str:
    return f"[the current file is {size} bytes, too large to diff; it will be replaced]\n"


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
    changed_since=changed_since,
    path_arguments=("path",),
)
