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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dispatcher.tools._paths import lexical_relative, unsafe_character
from dispatcher.tools.base import ClientToolset, Tool, open_object, unlisted_fallbacks
from dispatcher.tools.claude_code import MCP_NAME, TOOL_NAME, present_bash

CLIENT = "codex"
MAX_PATCH_FILES = 500

BEGIN, END = "*** Begin Patch", "*** End Patch"
# The headers that name a file (each followed by one space, then the path, exactly as
# Codex's parser strips them), and the markers that name none.
FILE_HEADERS = ("*** Add File:", "*** Update File:", "*** Delete File:", "*** Move to:")
OTHER_MARKERS = (BEGIN, END, "*** End of File")
# What Rust's str::trim removes (Unicode White_Space). Python's str.strip also removes
# U+001C..U+001F, which Rust keeps: a line Harness trimmed that way would not be the line
# Codex reads.
RUST_WHITESPACE = "".join(
    chr(c) for c in range(0x3001) if chr(c).isspace() and not 0x1C <= c <= 0x1F
)


def rust_lines(text: str) -> list[str]:
    """`text` split as Rust's str::lines splits it (what Codex's patch parser reads): at
    `\n` only, one `\r` before it dropped, no empty last line after a final `\n`. Never at
    U+2028, U+2029, U+0085, `\v`, `\f` or a lone `\r`, where Python's splitlines splits."""
    *complete, last = text.split("\n")
    return [line.removesuffix("\r") for line in complete] + ([last] if last else [])


def patch_paths(patch: str) -> tuple[str, ...]:
    """The paths a Codex patch touches, in order; raises ValueError naming what cannot be
    read (not a patch, an unknown `***` line, a header without a path, a path with a
    control or line-separator character or surrounding whitespace, too many files).

    The patch is split into lines and each line trimmed exactly as Codex's parser does
    (`patch.trim().lines()`, then `line.trim()`: Rust's rules, `rust_lines`,
    `RUST_WHITESPACE`), so Harness reads the path Codex will use. Conservative on purpose:
    any trimmed line starting with `***` must be a header Harness knows, so a content line
    that only looks like a header once trimmed is treated as one; Harness may refuse a
    patch Codex would apply, but never misses a file Codex would touch.
    """
    lines = [line.strip(RUST_WHITESPACE) for line in rust_lines(patch.strip(RUST_WHITESPACE))]
    if not lines or lines[0] != BEGIN:
        raise ValueError(f"a patch must start with '{BEGIN}'")
    if lines[-1] != END:
        raise ValueError(f"a patch must end with '{END}'")
    paths = [
        _header_path(line, number)
        for number, line in enumerate(lines, start=1)
        if line.startswith("***") and line not in OTHER_MARKERS
    ]
    if not paths:
        raise ValueError("the patch names no file")
    if len(paths) > MAX_PATCH_FILES:
        raise ValueError(f"the patch names more than {MAX_PATCH_FILES} files")
    return tuple(paths)


def _header_path(line: str, number: int) -> str:
    """The path of the trimmed header `line` (line `number` of the patch), exactly as
    Codex takes it: what follows the header and one space; raises ValueError."""
    header = next((h for h in FILE_HEADERS if line.startswith(h)), None)
    if header is None:
        raise ValueError(f"line {number} is not a patch header Harness knows: {line[:80]!r}")
    rest = line[len(header) :]
    if not rest:
        raise ValueError(f"line {number} ('{header}') names no file")
    if not rest.startswith(" "):
        raise ValueError(f"line {number} is not a patch header Harness knows: {line[:80]!r}")
    path = rest[1:]
    unsafe = unsafe_character(path)
    if unsafe is not None:
        raise ValueError(
            f"line {number} ('{header}') names a path with {unsafe}, which Codex and "
            "a reader may take for different paths"
        )
    if path != path.strip(RUST_WHITESPACE):
        raise ValueError(
            f"line {number} ('{header}') names a path that begins or ends with whitespace: "
            f"{path[:80]!r}"
        )
    return path


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
        # (read by Codex's rules, not a unified diff's: approval_tags.diff_lines)
        "format": "codex_patch",
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
    open_object({"command": {"type": "string", "minLength": 1}}, ("command",)),
    command_argument="command",
    command_shell="bash",
    open_world=True,
    present_call=present_bash,
)
APPLY_PATCH = _tool(
    "apply_patch",
    "Codex adds, changes, moves or deletes files with a patch in its own format.",
    open_object({"command": {"type": "string", "minLength": 1}}, ("command",)),
    embedded_paths=_patch_argument_paths,
    present_call=present_patch,
)

TOOLS: tuple[Tool, ...] = (BASH, APPLY_PATCH)


def _describe_mcp(name: str) -> str:
    server, _, tool = name[len("mcp__") :].partition("__")
    return f"The tool '{tool}' of the MCP server '{server}', run by Codex."


resolve_unknown, resolve_mcp = unlisted_fallbacks(
    client="Codex",
    mcp_name=MCP_NAME,
    tool_name=TOOL_NAME,
    describe_mcp=_describe_mcp,
    make_tool=_tool,
)

TOOLSET = ClientToolset(
    client=CLIENT, tools=TOOLS, fallback=resolve_unknown, rule_fallback=resolve_mcp
)
