"""search_files: find lines matching a regular expression in workspace files.

Patterns are compiled by RE2 (google-re2), whose matching time is linear in the input:
no pattern, however written, can hold a worker (Python's `re` backtracks, and
`(.+)+\\x01` on one long line never ends while holding the GIL).
"""

from __future__ import annotations

import errno
import fnmatch
import os
import stat
from collections.abc import Generator
from pathlib import Path
from typing import Any

import re2

from dispatcher.tools._confined import (
    READ,
    changed,
    changed_message,
    open_beneath,
    opened,
    read_at_most,
)
from dispatcher.tools._paths import cap_text, looks_binary, resolve_in_workspace
from dispatcher.tools.base import ExecutionContext, Tool, ToolError

MAX_MATCHES = 200
MAX_LINE_CHARS = 500
MAX_FILE_BYTES = 10 * 1024 * 1024
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn"})


def search_files(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """Lines "relpath:lineno: line" matching `pattern`, at most MAX_MATCHES of them.

    Binary, non-UTF-8 and very large files are skipped; so are VCS directories and
    symlinks leaving the workspace. Raises ToolError for an invalid regex or missing path.
    """
    regex = compile_pattern(args["pattern"])
    relative = args.get("path", ".")
    start = resolve_in_workspace(ctx.workspace, relative)
    try:
        with opened(ctx.workspace, start, READ) as start_fd:
            matches = _search(ctx.workspace, start, start_fd, regex, args.get("glob"))
    except (FileNotFoundError, NotADirectoryError) as error:
        raise ToolError(
            f"Path '{relative}' does not exist. Use list_directory to look around."
        ) from error
    except OSError as error:
        if changed(error):
            raise ToolError(changed_message(relative)) from error
        raise ToolError(f"Could not search '{relative}': {error.strerror or error}.") from error
    if not matches:
        return f"No matches for {args['pattern']!r} in '{relative}'."
    text = "\n".join(matches[:MAX_MATCHES])
    if len(matches) > MAX_MATCHES:
        text += f"\n[truncated: more than {MAX_MATCHES} matches; narrow the pattern, path or glob]"
    return cap_text(text, ctx.output_limit, "narrow the pattern, path or glob")


def _search(workspace: Path, start: Path, start_fd: int, regex: Any, glob: str | None) -> list[str]:
    """Up to MAX_MATCHES + 1 matching lines of the files under `start`."""
    matches: list[str] = []
    candidates = _candidate_files(workspace, start, start_fd)
    try:
        for directory, name, shown in candidates:
            if not _glob_matches(glob, name, shown):
                continue
            data = _file_bytes(workspace, directory, name, shown)
            if data is not None:
                matches.extend(_matches_in(data, shown, regex, MAX_MATCHES + 1 - len(matches)))
            if len(matches) > MAX_MATCHES:
                break
    finally:
        candidates.close()  # closes the walk's directory descriptors now
    return matches


def compile_pattern(pattern: str) -> Any:
    """The compiled RE2 pattern; raises ToolError saying what RE2 does not accept."""
    options = re2.Options()
    options.log_errors = False  # the error goes to the model, not to the worker's stderr
    try:
        return re2.compile(pattern, options)
    except re2.error as error:
        reason = error.args[0] if error.args else error
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", errors="replace")
        raise ToolError(
            f"Invalid regular expression {pattern!r}: {reason}. Patterns use RE2 syntax "
            "(like Python `re`, but without backreferences such as \\1 and without "
            "lookahead or lookbehind); fix the pattern."
        ) from error


def _candidate_files(
    workspace: Path, start: Path, start_fd: int
) -> Generator[tuple[int, str, str], None, None]:
    """(directory descriptor, entry name, path shown) for the files under `start` in
    sorted order, skipping VCS directories.

    The walk is `os.fwalk` without following symlinks: each directory is opened relative
    to its parent's descriptor and checked to be the directory that was listed, so a
    directory swapped for a symlink is not entered. The descriptor is valid until the
    next item.
    """
    try:
        base = start.relative_to(workspace.resolve())
    except ValueError:  # the workspace's path leads elsewhere now (a nested one, flipped)
        raise OSError(errno.EXDEV, "path is not inside the workspace", str(start)) from None
    if not stat.S_ISDIR(os.fstat(start_fd).st_mode):
        yield start_fd, "", base.as_posix()  # `start` is the file itself
        return
    for directory, dirnames, filenames, directory_fd in os.fwalk(
        ".", dir_fd=start_fd, follow_symlinks=False
    ):
        dirnames[:] = sorted(name for name in dirnames if name not in SKIPPED_DIRS)
        for name in sorted(filenames):
            yield directory_fd, name, (base / directory / name).as_posix()


def _glob_matches(glob: str | None, name: str, shown: str) -> bool:
    if not glob:
        return True
    return fnmatch.fnmatch(shown if "/" in glob else (name or Path(shown).name), glob)


def _file_bytes(workspace: Path, directory: int, name: str, shown: str) -> bytes | None:
    """The content of a regular file of at most MAX_FILE_BYTES, else None.

    A plain file is opened relative to its directory's descriptor with `O_NOFOLLOW`; a
    symlink is followed only when it resolves inside the workspace without a step
    outside (`resolve_in_workspace`, as `path_violation`), and the target is then opened
    with no symlink followed (`_confined`).
    """
    try:
        if not name:
            fd = os.dup(directory)
        else:
            try:
                fd = os.open(name, READ | os.O_NOFOLLOW, dir_fd=directory)
            except OSError as error:
                if error.errno != errno.ELOOP:
                    raise
                try:  # followed inside the workspace only, as the guard follows it:
                    target = resolve_in_workspace(workspace, shown)
                except ToolError:  # a symlink leaving the workspace (nothing outside
                    return None  # looked at: no answer that tells what the host holds)
                fd = open_beneath(workspace, target, READ)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
                return None
            data = read_at_most(fd, MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
    except (OSError, RuntimeError):  # unreadable, a symlink loop, or changed meanwhile
        return None
    return data if len(data) <= MAX_FILE_BYTES else None


def _matches_in(data: bytes, shown: str, regex: Any, room: int) -> list[str]:
    """Up to `room` matching lines of one file's content; [] for binary or non-UTF-8."""
    if looks_binary(data[:8192]):
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    found: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if regex.search(line):
            found.append(f"{shown}:{number}: {line[:MAX_LINE_CHARS]}")
            if len(found) >= room:
                break
    return found


TOOL = Tool(
    name="search_files",
    description=(
        "Search workspace files for lines matching a regular expression (RE2 syntax: "
        "like Python re, without backreferences or lookaround). "
        "`path` (default '.') is a file or directory relative to the workspace; `glob` "
        "filters file names, e.g. '*.py'. Returns 'path:line: text' for each match "
        f"(at most {MAX_MATCHES}); binary files are skipped."
    ),
    parameters={
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Regular expression (RE2 syntax)."},
            "path": {
                "type": "string",
                "default": ".",
                "description": "File or directory relative to the workspace.",
            },
            "glob": {"type": "string", "description": "File name filter, e.g. '*.py'."},
        },
        "required": ["pattern"],
        "additionalProperties": False,
    },
    execute=search_files,
    read_only=True,
    is_concurrency_safe=True,
    path_arguments=("path",),
)
