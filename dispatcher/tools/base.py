"""What a tool is: a model-facing face and a host-only face (docs/architecture.md; principle 2 of the design)."""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ToolError(Exception):
    """Raised by a tool body for a failure the model should read (becomes is_error=True)."""


@dataclass(frozen=True)
class ExecutionContext:
    """What a tool body gets besides its arguments. It knows nothing of policy or audit."""

    workspace: Path
    call_id: str
    timeout: float
    output_limit: int
    # The call's arguments exactly as logged (an upstream MCP tool sends these bytes).
    raw_arguments: str = ""
    # The event loop of the web request that runs the call inline and awaits it, so it
    # runs until the call ends (execution.run_inline, run_body_async; None in a worker):
    # an I/O body may make its request there rather than on a loop of its own.
    loop: asyncio.AbstractEventLoop | None = None
    # When the call's timeout ends (time.monotonic()), set by pipeline.execute as the body
    # starts; its host's backstop answers "timed out" a second later. A body that waits
    # before it acts (an upstream call waiting for its session) must not act past it.
    deadline: float | None = None
    # What of the workspace's git metadata that makes git run programs (.git/config,
    # hooks/ ...) a program it starts may not write (dispatcher.tools.sandbox_git: "all",
    # "all-but-config", "none"). "all" unless a reviewer approved the call
    # (execution._execution_context): a command no person saw may not plant what a later
    # `git status` runs.
    git_guard: str = "all"


def storable_text(text: str) -> str:
    """`text` as every database keeps it as it is: a NUL character written out as
    `\\u0000` (PostgreSQL refuses NUL in text and jsonb: `find -print0`'s output, an
    upstream server's answer), a lone surrogate replaced."""
    return text.replace("\x00", "\\u0000").encode("utf-8", "replace").decode("utf-8")


def default_project_content(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)


def default_finalize_content(content: str) -> str:
    return content


def default_present_call(arguments: dict[str, Any], workspace: Path) -> dict[str, Any]:
    return {"kind": "arguments", "text": json.dumps(arguments, indent=2, ensure_ascii=False)}


def default_present_result(content: str) -> dict[str, Any]:
    return {"kind": "text", "text": content}


@dataclass(frozen=True, eq=False)  # identity hashing: a tool is one registry entry
class Tool:
    # --- model-facing: the only fields `model_facing_schema` may read -----------------
    name: str
    description: str
    parameters: dict[str, Any]
    defer_loading: bool = False
    # --- host-only: never shown to a model ----------------------------------------------
    execute: Callable[[ExecutionContext, dict[str, Any]], Any] = field(
        default=lambda ctx, args: None
    )
    output_schema: dict[str, Any] | None = None
    project_content: Callable[[Any], str] = default_project_content
    finalize_content: Callable[[str], str] = default_finalize_content
    timeout: float = 30.0
    is_concurrency_safe: bool = False
    # I/O-bound and safe to run in the web process that admitted the call (an upstream
    # MCP server's tool over HTTP: a request on an open session, nothing started or read
    # on this host): the request that waits for it may claim and run it itself, without
    # the queue (execution.run_inline; the worker is the fallback).
    inline: bool = False
    # An inline tool's body as a coroutine, awaited on the event loop of the request that
    # runs the call (execution.run_body_async): it holds no thread while it waits for its
    # server, so calls that hang hold none of the web process's threads. None: `execute`,
    # on a thread. Both make the same request and raise the same errors.
    execute_async: Callable[[ExecutionContext, dict[str, Any]], Awaitable[Any]] | None = None
    present_call: Callable[[dict[str, Any], Path], dict[str, Any]] = default_present_call
    present_result: Callable[[str], dict[str, Any]] = default_present_result
    # Risk annotations: modes are built on these, never on tool names.
    read_only: bool = False
    destructive: bool = False
    open_world: bool = False
    # Names of arguments that are paths inside the workspace (the confinement guard
    # checks them; path rules match them).
    path_arguments: tuple[str, ...] = ()
    # Name of the argument holding an argv list (the command guard checks it).
    command_argument: str | None = None
    # When set, `command_argument` holds one shell command string instead of an argv list
    # (Claude Code's Bash), which the command guard and rules read as
    # [command_shell, "-c", string]: see `command_argv`.
    command_shell: str | None = None
    # Decide-only: the client runs the tool (Claude Code's own tools, an MCP client's);
    # Harness decides, never executes, and records what the client reports. Its paths are
    # on the client's disk: they are confined lexically, never resolved here.
    client_executed: bool = False
    # An ask is previewed first (dispatcher.previews): argv run over a copy-on-write
    # view of the workspace, its effect shown, approved and then applied.
    previewable: bool = False
    # For a tool whose presentation shows the state it changes (write_file's diff of the
    # file as it is): why the workspace is no longer as the reviewer saw it (the
    # presentation of the approved ask), or None. The worker asks under the workspace
    # lock before it runs an approved call, and asks the reviewer again when it changed.
    changed_since: Callable[[dict[str, Any], Path, dict[str, Any]], str | None] | None = None
    # What every call of the tool is bound to from its admission on, allowed or asked (an
    # upstream tool's server registration and accepted definition: the keys its
    # presentation shows a reviewer too). Kept in the call's provenance at admission; the
    # worker refuses the call when the tool it would run has another (execution).
    binding: Mapping[str, Any] | None = None
    # Other tool names whose rules also cover this tool (Claude Code's `Edit(src/**)`
    # also covers Write, as in Claude Code's own permission rules).
    rule_aliases: tuple[str, ...] = ()
    # Paths named inside an argument's text rather than as arguments of their own (the
    # file headers of a Codex patch). Confined and matched by path rules like
    # `path_arguments`; raises ValueError when the text cannot be read completely, and
    # the confinement guard then denies the call.
    embedded_paths: Callable[[Mapping[str, Any]], tuple[str, ...]] | None = None
    # A client's tool Harness has no definition of (Claude Code's `Artifact`, a tool of a
    # later client version: `unlisted_fallbacks`). What its input means is unknown, so the
    # confinement guard reads the values of its path-like keys (`input_paths`) as paths
    # and confines them as it does `path_arguments` (fail closed).
    unlisted_paths: bool = False


# The keys of an unlisted client tool's input read as paths (`input_paths`), compared
# with case, `_` and `-` left out: any key ending in "path" or "paths" (file_path,
# file_paths, notebook_path, dir_path, local_path, scriptPath, worktreePath ...), or in a
# name of a directory (dir, directory, folder, cwd: out_dir, outputDirectory,
# target_folder, initial_cwd; the ending, not the whole key: Claude Code's `Artifact`
# saves an asset into its `out_dir`, which the whole names alone missed).
PATH_KEY_SUFFIXES = (
    *("path", "paths", "dir", "dirs", "directory", "directories"),
    *("folder", "folders", "cwd"),
)
# Keys that often name a file but as often hold something else (`target: "es2020"`,
# `source: "user"`, `input: "yes"`, `to: "a@b.c"`): the whole key, or its last word
# (`copy_target`, `dataSource`, `save-to`; a word, not an ending: `resource`, `profile`,
# `photo` are not read). Only a string value that looks like a path (`looks_like_path`)
# is confined; any other value is read as the rest of the input is. Before, an unlisted
# tool writing through `target` or `dest` left the project unconfined.
LOOSE_PATH_WORDS = frozenset(
    {
        *("target", "targets", "src", "srcs", "source", "sources", "dest", "dests"),
        *("dst", "dsts"),
        *("destination", "destinations", "file", "files", "filename", "filenames"),
        *("output", "outputs", "out", "input", "inputs", "from", "to"),
    }
)
LOOSE_PATH_KEYS = frozenset(
    {
        *("outfile", "infile", "outputfile", "inputfile", "srcfile", "sourcefile"),
        *("destfile", "targetfile", "outfiles", "infiles", "savefile", "savefiles"),
    }
)
MAX_INPUT_DEPTH = 16  # objects and lists nested deeper are not read: the input is refused
MAX_INPUT_VALUES = 100_000  # values of an input read at most; past them it is refused
_KEY_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_path_key(key: str) -> bool:
    # (`file_path_2`, `outDir1`: a number after the word is no other word)
    name = key.lower().replace("_", "").replace("-", "").rstrip("0123456789")
    return name.endswith(PATH_KEY_SUFFIXES)


def is_loose_path_key(key: str) -> bool:
    """A key that may name a file (`target`, `src`, `dest`, `output_file`, `copyTo` ...:
    LOOSE_PATH_WORDS as the whole key or its last word, LOOSE_PATH_KEYS)."""
    # (`src1`, `dest_2`, `outfile2`: a number after the word is no other word)
    name = key.lower().replace("_", "").replace("-", "").rstrip("0123456789")
    if name in LOOSE_PATH_WORDS or name in LOOSE_PATH_KEYS:
        return True
    words = [word.rstrip("0123456789") for word in _KEY_WORDS.findall(key)]
    words = [word for word in words if word]
    return bool(words) and words[-1].lower() in LOOSE_PATH_WORDS


def looks_like_path(value: str) -> str | None:
    """The path a loose key's string value names, or None when it looks like none: one
    line (white space around it aside), not a URL (but `file://` or `file:/`, whose path
    is returned; nor one with a `..` part, which a lexical join folds), and, white space around it
    left out, starting with `/`, `~` or `.` (`./x`, `../x`, `.`), holding a `..` part, or
    holding `/` or `\\` and no white space (`out/report.md`). A sentence with a slash in
    it (`compare a/b`) is no path; `../../etc/x` and `/etc/x` are."""
    text = value.strip()
    if "\n" in text or "\r" in text:
        return None  # (text of several lines)
    if text.lower().startswith("file://"):  # (`file://host/x` is `/x` on that host)
        rest = text[len("file://") :]
        return rest[rest.find("/") :] if "/" in rest else "/"
    if text.lower().startswith("file:/"):  # (one slash: `new URL` reads `/etc/x`)
        return text[len("file:") :]
    if ".." in re.split(r"[/\\]", text):
        return value  # (`a://../../etc/x` too: a lexical path join folds it to /etc/x)
    if not text or _URL.match(text):
        return None
    if text.startswith(("/", "~", ".")):
        return value
    if ("/" in text or "\\" in text) and not any(c.isspace() for c in text):
        return value
    return None


def input_paths(arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """The paths an unlisted client tool's input names: the value of every path-like key
    (`is_path_key`), at any depth of its objects and lists, a string or a list of strings;
    and each string under a loose key (`is_loose_path_key`: `target`, `dest` ...), at any
    depth of the objects and lists it holds (`{"target": {"value": "/etc/x"}}`, a list of
    objects: before, only a string or a list of strings there was read), and each key of
    an object there (`{"files": {"/etc/cron.d/x": "..."}}`, a map of paths to their
    content: before, its keys were not read), that looks like a path (`looks_like_path`).

    Raises ValueError when a path-like key holds anything else (a number, an object, a
    list holding one), or the input nests deeper than MAX_INPUT_DEPTH or holds more than
    MAX_INPUT_VALUES values: Harness cannot tell what the client makes of it, and the
    confinement guard denies the call."""
    found: list[str] = []
    seen = 0

    def walk(value: Any, depth: int, loose: bool = False) -> None:
        nonlocal seen
        seen += 1
        if depth > MAX_INPUT_DEPTH:
            raise ValueError(f"the input nests more than {MAX_INPUT_DEPTH} levels deep")
        if seen > MAX_INPUT_VALUES:
            raise ValueError(f"the input holds more than {MAX_INPUT_VALUES} values")
        if loose and isinstance(value, str):
            path = looks_like_path(value)
            found.extend([path] if path is not None else [])
            return
        items = value.items() if isinstance(value, Mapping) else ()
        for key, item in items:
            if loose:  # (`{"files": {"/etc/cron.d/x": "..."}}`: a path to what it holds)
                path = looks_like_path(str(key))
                found.extend([path] if path is not None else [])
            if is_path_key(str(key)):
                found.extend(_path_values(str(key), item))
            else:
                walk(item, depth + 1, loose or is_loose_path_key(str(key)))
        for item in value if isinstance(value, list) else ():
            walk(item, depth + 1, loose)

    walk(arguments, 0)
    return tuple(found)


def _path_values(key: str, value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    raise ValueError(f"'{key}' is neither a path nor a list of paths")


def confined_paths(tool: Tool, arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """The paths the confinement guard checks besides `path_arguments`: `tool_paths`, and
    an unlisted client tool's `input_paths`. Raises ValueError as they do."""
    found = tool_paths(tool, arguments)
    return found + input_paths(arguments) if tool.unlisted_paths else found


def tool_paths(tool: Tool, arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """The paths `embedded_paths` finds in `arguments` (none for most tools); raises
    ValueError, as `embedded_paths` does, when they cannot be read."""
    return tool.embedded_paths(arguments) if tool.embedded_paths is not None else ()


def command_argv(tool: Tool, arguments: Mapping[str, Any]) -> list[str] | None:
    """The command line the command guard and command rules read, or None when the
    argument is missing or not of the tool's form (an argv list of strings, or, for a
    tool with `command_shell`, one string, read as `[command_shell, "-c", string]`)."""
    value = arguments.get(tool.command_argument or "")
    if tool.command_shell:
        return [tool.command_shell, "-c", value] if isinstance(value, str) else None
    if isinstance(value, list) and all(isinstance(word, str) for word in value):
        return list(value)
    return None


@dataclass(frozen=True)
class ClientToolset:
    """The tools one kind of client runs itself (decide-only), e.g. Claude Code's.

    Resolved only for sessions of that client (`AgentSession.client`), never listed by
    GET /api/v1/tools. `fallback` names the tool for a name not in `tools` (an MCP tool,
    a tool of a newer client version), or None to reject the name as unknown;
    `rule_fallback` the same for names in permission rules (narrower, so that a typo in a
    rule is still an error).
    """

    client: str
    tools: tuple[Tool, ...]
    fallback: Callable[[str], Tool | None] = field(default=lambda name: None)
    rule_fallback: Callable[[str], Tool | None] = field(default=lambda name: None)


def open_object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A client tool's object schema: it allows the fields a later client version adds."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": True,
    }


def unlisted_fallbacks(
    *,
    client: str,
    mcp_name: re.Pattern[str],
    tool_name: re.Pattern[str],
    describe_mcp: Callable[[str], str],
    make_tool: Callable[..., Tool],
) -> tuple[Callable[[str], Tool | None], Callable[[str], Tool | None]]:
    """A ClientToolset's `fallback` and `rule_fallback`, the same for every client: a name
    matching `mcp_name` is an MCP tool the client runs (open-world; its arguments are its
    server's to read, and the server may run anywhere: not read as paths), one matching
    `tool_name` another tool of the client (neither read-only, so standard mode asks; the
    paths under its input's path-like keys are confined: `unlisted_paths`); other names
    are unknown. Rules may name any MCP tool but no other unlisted name."""

    @functools.lru_cache(maxsize=1024)  # bounded: names come from the client
    def resolve_unknown(name: str) -> Tool | None:
        if mcp_name.match(name):
            return make_tool(name, describe_mcp(name), open_object({}), open_world=True)
        if tool_name.match(name):
            return make_tool(
                name,
                f"{client}'s tool '{name}' (not known to Harness).",
                open_object({}),
                unlisted_paths=True,
            )
        return None

    def resolve_mcp(name: str) -> Tool | None:
        return resolve_unknown(name) if mcp_name.match(name) else None

    return resolve_unknown, resolve_mcp


def model_facing_schema(tool: Tool, format: str = "native") -> dict[str, Any]:
    """The model-facing definition of `tool` in one SDK's format.

    Names the allowed fields one by one (name, description, parameters, defer_loading;
    for MCP, its annotations read from the risk flags): it never copies the definition
    and filters, so a new host-only field cannot leak.
    """
    if format == "openai":
        return {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
            },
        }
    if format == "anthropic":
        schema: dict[str, Any] = {
            "name": tool.name,
            "description": tool.description,
            "input_schema": tool.parameters,
        }
        if tool.defer_loading:
            schema["defer_loading"] = True
        return schema
    if format == "native":
        return {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "defer_loading": tool.defer_loading,
        }
    if format == "mcp":
        return {
            "name": tool.name,
            "description": tool.description,
            "inputSchema": tool.parameters,
            # Harness's own reading of the tool (for an upstream tool: its hints as far as
            # they are trusted), so a client shows what Harness will treat it as.
            "annotations": {
                "readOnlyHint": tool.read_only,
                "destructiveHint": tool.destructive,
                "openWorldHint": tool.open_world,
            },
        }
    raise ValueError(f"Unknown format {format!r}; use native, openai, anthropic or mcp.")
