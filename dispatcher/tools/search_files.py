"""search_files: find lines matching a regular expression in workspace files.

Patterns are compiled by RE2 (google-re2), whose matching time is linear in the input:
no pattern, however written, can hold a worker (Python's `re` backtracks, and
`(.+)+\\x01` on one long line never ends while holding the GIL).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import re2

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
    if not start.exists():
        raise ToolError(f"Path '{relative}' does not exist. Use list_directory to look around.")
    root = ctx.workspace.resolve()
    matches: list[str] = []
    for path in _candidate_files(start, root, args.get("glob")):
        matches.extend(_matches_in(path, root, regex, MAX_MATCHES + 1 - len(matches)))
        if len(matches) > MAX_MATCHES:
            break
    if not matches:
        return f"No matches for {args['pattern']!r} in '{relative}'."
    text = "\n".join(matches[:MAX_MATCHES])
    if len(matches) > MAX_MATCHES:
        text += f"\n[truncated: more than {MAX_MATCHES} matches; narrow the pattern, path or glob]"
    return cap_text(text, ctx.output_limit, "narrow the pattern, path or glob")


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


def _candidate_files(start: Path, root: Path, glob: str | None) -> Iterator[Path]:
    """Files under `start` in sorted order, filtered by `glob`, never leaving `root`."""
    if start.is_file():
        paths: Iterator[Path] = iter([start])
    else:
        paths = _walk(start)
    for path in paths:
        relative = path.relative_to(root).as_posix()
        subject = relative if glob and "/" in glob else path.name
        if glob and not fnmatch.fnmatch(subject, glob):
            continue
        if path.resolve().is_relative_to(root):
            yield path


def _walk(start: Path) -> Iterator[Path]:
    for directory, dirnames, filenames in os.walk(start, followlinks=False):
        dirnames[:] = sorted(name for name in dirnames if name not in SKIPPED_DIRS)
        for name in sorted(filenames):
            yield Path(directory) / name


def _matches_in(path: Path, root: Path, regex: Any, room: int) -> list[str]:
    """Up to `room` matching lines of one file; [] for unreadable or binary files."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return []
        data = path.read_bytes()
    except OSError:
        return []
    if looks_binary(data[:8192]):
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    relative = path.relative_to(root).as_posix()
    found: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if regex.search(line):
            found.append(f"{relative}:{number}: {line[:MAX_LINE_CHARS]}")
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
