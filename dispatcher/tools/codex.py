"""Codex CLI's tools, as decide-only Harness tools (the client runs them).

Codex asks its PreToolUse hook before a shell command (`Bash`, whatever the model called:
exec_command, shell, shell_command), an `apply_patch` and an MCP tool
(`mcp__server__tool`); measured with @openai/codex 0.171.0. Both `Bash` and
`apply_patch` carry their text in `tool_input.command`. These tools exist only for Codex
sessions (`TOOLSET`, named in settings.HARNESS_CLIENT_TOOLS).

`Bash` is one shell string Codex runs in bash (`bash -lc`), read by the same command
reader and blocklist as Claude Code's `Bash`. `apply_patch` carries a patch in Codex's own
format; the files it touches are named by its `*** Add File:`, `*** Update File:`,
`*** Delete File:` and `*** Move to:` headers, each confined lexically to the session's
project directory (the hook's cwd), as Claude Code's paths are. A patch whose headers
Harness cannot read completely is denied, never guessed at.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dispatcher.tools._paths import lexical_relative
from dispatcher.tools.base import ClientToolset, Tool
from dispatcher.tools.claude_code import MCP_NAME, TOOL_NAME, present_bash

CLIENT = "codex"
MAX_PATCH_FILES = 500

BEGIN, END = "*** Begin Patch", "*** End Patch"
# The headers that name a file, and the markers that name none.
FILE_HEADERS = ("*** Add File:", "*** Update File:", "*** Delete File:", "*** Move to:")
OTHER_MARKERS = (BEGIN, END, "*** End of File")


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": True,
    }


def patch_paths(patch: str) -> tuple[str, ...]:
    """The paths a Codex patch touches, in order; raises ValueError naming what cannot be
    read (not a patch, an unknown `***` line, a header without a path, too many files).

    Conservative on purpose: every line is read with its surrounding whitespace removed
    (as Codex reads headers), and any such line starting with `***` must be a header
    Harness knows. A content line (`+`, `-`, space) that only looks like a header once
    stripped is treated as one, so Harness may refuse a patch Codex would apply, but never
    misses a file Codex would touch.
    """
    lines = [line.strip() for line in patch.strip().splitlines()]
    if not lines or lines[0] != BEGIN:
        raise ValueError(f"a patch must start with '{BEGIN}'")
    if lines[-1] != END:
        raise ValueError(f"a patch must end with '{END}'")
    paths: list[str] = []
    for number, line in enumerate(lines, start=1):
        if not line.startswith("***"):
            continue
        if line in OTHER_MARKERS:
            continue
        header = next((h for h in FILE_HEADERS if line.startswith(h)), None)
        if header is None:
            raise ValueError(f"line {number} is not a patch header Harness knows: {line[:80]!r}")
        path = line[len(header) :].strip()
        if not path:
            raise ValueError(f"line {number} ('{header}') names no file")
        paths.append(path)
    if not paths:
        raise ValueError("the patch names no file")
    if len(paths) > MAX_PATCH_FILES:
        raise ValueError(f"the patch names more than {MAX_PATCH_FILES} files")
    return tuple(paths)


def _patch_argument_paths(arguments: Mapping[str, Any]) -> tuple[str, ...]:
    patch = arguments.get("command")
    if not isinstance(patch, str):
        raise ValueError("'command' must be the patch text")
    return patch_paths(patch)


def present_patch(arguments: dict[str, Any], project: Path) -> dict[str, Any]:
    """The patch as Codex will apply it, with the files it names (relative to the project)."""
    patch = str(arguments.get("command", ""))
    try:
        paths = [lexical_relative(p, project) or p for p in patch_paths(patch)]
    except ValueError:
        paths = []
    return {
        "kind": "diff",
        "path": ", ".join(paths),
        "diff": patch,
        "new_file": False,
        "files": paths,
        "project": str(project),
    }


def _tool(name: str, description: str, parameters: dict[str, Any], **host: Any) -> Tool:
    return Tool(
        name=name, description=description, parameters=parameters, client_executed=True, **host
    )


BASH = _tool(
    "Bash",
    "Codex runs a shell command (one string, in bash) on the developer's machine.",
    _object({"command": {"type": "string", "minLength": 1}}, ("command",)),
    command_argument="command",
    command_shell="bash",
    open_world=True,
    present_call=present_bash,
)
APPLY_PATCH = _tool(
    "apply_patch",
    "Codex adds, changes, moves or deletes files with a patch in its own format.",
    _object({"command": {"type": "string", "minLength": 1}}, ("command",)),
    embedded_paths=_patch_argument_paths,
    present_call=present_patch,
)

TOOLS: tuple[Tool, ...] = (BASH, APPLY_PATCH)


@functools.lru_cache(maxsize=1024)  # bounded: names come from the client
def resolve_unknown(name: str) -> Tool | None:
    """An MCP tool as Codex names it (`mcp__server__tool`, open-world), or another tool of
    a newer Codex; neither is read-only, so standard mode asks. None for other names."""
    if MCP_NAME.match(name):
        server, _, tool = name[len("mcp__") :].partition("__")
        return _tool(
            name,
            f"The tool '{tool}' of the MCP server '{server}', run by Codex.",
            _object({}),
            open_world=True,
        )
    if TOOL_NAME.match(name):
        return _tool(name, f"Codex's tool '{name}' (not known to Harness).", _object({}))
    return None


def resolve_mcp(name: str) -> Tool | None:
    return resolve_unknown(name) if MCP_NAME.match(name) else None


TOOLSET = ClientToolset(
    client=CLIENT, tools=TOOLS, fallback=resolve_unknown, rule_fallback=resolve_mcp
)
