"""Claude Code's own tools, as decide-only Harness tools (the client runs them).

Claude Code asks its PreToolUse hook before each tool call; Harness admits the call like
any other (stored, validated against the schemas below, rules, mode, guards), answers
allow or deny, and records what the PostToolUse hook reports. These tools exist only for
Claude Code sessions (`TOOLSET`, named in settings.HARNESS_CLIENT_TOOLS): they are never
listed by GET /api/v1/tools, and no API session resolves them.

Schemas accept what Claude Code sends (measured with 2.1.328; older tools such as
MultiEdit and LS kept): the fields policy reads are typed, and further fields are allowed,
because Claude Code adds optional ones between versions. Annotations make the modes
right: reads are read-only; edits, Bash, and the open-world tools (WebFetch, WebSearch,
whose request itself carries data off the machine) ask in standard mode. A name not
listed here resolves to a generic tool that asks (`resolve_unknown`).

Paths (file_path, notebook_path, path, Glob's pattern) are on the client's disk: they are
confined lexically to the session's project directory (the hook's cwd), never resolved on
the Harness host (see dispatcher.tools._paths.lexical_relative).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dispatcher.tools._paths import lexical_relative
from dispatcher.tools.base import ClientToolset, Tool, open_object, unlisted_fallbacks
from dispatcher.tools.diffs import (
    NO_NEWLINE,
    NO_NEWLINE_TEXT,
    Budget,
    newline_lines,
    unified_diff,
)

CLIENT = "claude-code"
# A Claude Code tool name, and an MCP tool as Claude Code names it (mcp__server__tool).
TOOL_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
MCP_NAME = re.compile(r"^mcp__[A-Za-z0-9_-]{1,64}__[A-Za-z0-9_.-]{1,128}$")


STRING: dict[str, Any] = {"type": "string"}
PATH: dict[str, Any] = {"type": "string", "description": "An absolute path on the client."}
NUMBER: dict[str, Any] = {"type": "number"}
BOOLEAN: dict[str, Any] = {"type": "boolean"}


# --- What a reviewer sees -----------------------------------------------------------------


def _shown_path(path: str, project: Path) -> str:
    relative = lexical_relative(path, project)
    return path if relative is None else relative


def _diff(
    old: str,
    new: str,
    path: str,
    project: Path,
    budget: Budget | None = None,
    *,
    whole_file: bool = False,
) -> str:
    """The unified diff a reviewer reads, made in bounded time (dispatcher.tools.diffs: the
    strings are the model's; difflib alone took minutes on some). Texts are cut at
    newlines only (a U+2028 or form feed inside a line stays in it, shown escaped), and a
    last line with none is shown so (`\\ No newline at end of the text`, `... of file`
    for a `whole_file`): each last line was once given a newline, and an Edit that only
    added one (`x` to `x\\n`) showed the reviewer "(no change)"."""
    shown = _shown_path(path, project)
    marker = NO_NEWLINE if whole_file else NO_NEWLINE_TEXT
    return "".join(
        unified_diff(
            newline_lines(old),
            newline_lines(new),
            f"a/{shown}",
            f"b/{shown}",
            budget=budget,
            no_newline=marker,
        )
    )


def present_bash(arguments: dict[str, Any], project: Path) -> dict[str, Any]:
    """The command as Claude Code will run it (one shell string, in bash) and the project;
    the approvals queue shows it with the simple commands the command reader sees in it."""
    return {
        "kind": "shell",
        "command": str(arguments.get("command", "")),
        "description": str(arguments.get("description", "")),
        "project": str(project),
        "background": bool(arguments.get("run_in_background")),
        "sandbox_disabled": bool(arguments.get("dangerouslyDisableSandbox")),
    }


def present_monitor(arguments: dict[str, Any], project: Path) -> dict[str, Any]:
    """Monitor's command as Bash's is shown; a WebSocket watch as its arguments."""
    if isinstance(arguments.get("command"), str):
        return present_bash(arguments, project)
    return present_arguments(arguments, project)


def present_edit(arguments: dict[str, Any], project: Path) -> dict[str, Any]:
    """old_string -> new_string in file_path, as a diff (the file itself is on the client)."""
    path = str(arguments.get("file_path", ""))
    old, new = str(arguments.get("old_string", "")), str(arguments.get("new_string", ""))
    return {
        "kind": "diff",
        "path": path,
        "diff": _diff(old, new, path, project),
        "new_file": False,
        "replace_all": bool(arguments.get("replace_all")),
        "project": str(project),
    }


def present_multi_edit(arguments: dict[str, Any], project: Path) -> dict[str, Any]:
    path = str(arguments.get("file_path", ""))
    edits = arguments.get("edits")
    edits = edits if isinstance(edits, list) else []
    budget = Budget()  # (one for all the edits: hundreds of them fit in a body)
    parts = [
        _diff(
            str(edit.get("old_string", "")), str(edit.get("new_string", "")), path, project, budget
        )
        for edit in edits
        if isinstance(edit, dict)
    ]
    return {
        "kind": "diff",
        "path": path,
        "diff": "".join(parts),
        "new_file": False,
        "edits": len(parts),
        "project": str(project),
    }


def present_write(arguments: dict[str, Any], project: Path) -> dict[str, Any]:
    """The whole new content of file_path (what it replaces is on the client's disk)."""
    path = str(arguments.get("file_path", ""))
    return {
        "kind": "diff",
        "path": path,
        "diff": _diff("", str(arguments.get("content", "")), path, project, whole_file=True),
        "new_file": False,
        "whole_content": True,
        "project": str(project),
    }


def present_notebook_edit(arguments: dict[str, Any], project: Path) -> dict[str, Any]:
    path = str(arguments.get("notebook_path", ""))
    return {
        "kind": "diff",
        "path": path,
        "diff": _diff("", str(arguments.get("new_source", "")), path, project),
        "new_file": False,
        "whole_content": True,
        "cell": str(arguments.get("cell_id", "")),
        "edit_mode": str(arguments.get("edit_mode", "replace")),
        "project": str(project),
    }


def present_arguments(arguments: dict[str, Any], project: Path) -> dict[str, Any]:
    return {"kind": "arguments", "project": str(project)}


# --- The tools ------------------------------------------------------------------------------


def _tool(name: str, description: str, parameters: dict[str, Any], **host: Any) -> Tool:
    host.setdefault("present_call", present_arguments)
    return Tool(
        name=name,
        description=description,
        parameters=parameters,
        client_executed=True,
        **host,
    )


BASH = _tool(
    "Bash",
    "Claude Code runs a shell command (one string, in bash) on the developer's machine.",
    open_object(
        {
            "command": {"type": "string", "minLength": 1},
            "description": STRING,
            "timeout": NUMBER,
            "run_in_background": BOOLEAN,
            "dangerouslyDisableSandbox": BOOLEAN,
        },
        ("command",),
    ),
    command_argument="command",
    command_shell="bash",
    open_world=True,
    present_call=present_bash,
)
# Monitor runs a shell command (or opens a WebSocket) and reports each line it prints:
# the same shell as Bash, so the same guard and rules (a rule for Bash is one for it).
MONITOR = _tool(
    "Monitor",
    "Claude Code runs a shell command on the developer's machine and watches what it prints "
    "(or watches a WebSocket).",
    open_object(
        {
            "command": {"type": "string", "minLength": 1},
            "ws": {"type": "object"},
            "description": STRING,
            "timeout_ms": NUMBER,
        },
        (),
    ),
    command_argument="command",
    command_shell="bash",
    open_world=True,
    rule_aliases=("Bash",),
    present_call=present_monitor,
)
READ = _tool(
    "Read",
    "Claude Code reads a file.",
    open_object(
        {"file_path": PATH, "offset": NUMBER, "limit": NUMBER, "pages": STRING},
        ("file_path",),
    ),
    read_only=True,
    path_arguments=("file_path",),
)
WRITE = _tool(
    "Write",
    "Claude Code creates or overwrites a file with the whole new content.",
    open_object({"file_path": PATH, "content": STRING}, ("file_path", "content")),
    path_arguments=("file_path",),
    rule_aliases=("Edit",),
    present_call=present_write,
)
EDIT = _tool(
    "Edit",
    "Claude Code replaces old_string with new_string in a file.",
    open_object(
        {"file_path": PATH, "old_string": STRING, "new_string": STRING, "replace_all": BOOLEAN},
        ("file_path", "old_string", "new_string"),
    ),
    path_arguments=("file_path",),
    present_call=present_edit,
)
MULTI_EDIT = _tool(
    "MultiEdit",
    "Claude Code makes several replacements in one file.",
    open_object(
        {
            "file_path": PATH,
            "edits": {
                "type": "array",
                "items": open_object(
                    {"old_string": STRING, "new_string": STRING, "replace_all": BOOLEAN},
                    ("old_string", "new_string"),
                ),
            },
        },
        ("file_path", "edits"),
    ),
    path_arguments=("file_path",),
    rule_aliases=("Edit",),
    present_call=present_multi_edit,
)
NOTEBOOK_EDIT = _tool(
    "NotebookEdit",
    "Claude Code replaces, inserts or deletes a cell of a Jupyter notebook.",
    open_object(
        {
            "notebook_path": PATH,
            "new_source": STRING,
            "cell_id": STRING,
            "cell_type": STRING,
            "edit_mode": STRING,
        },
        ("notebook_path",),
    ),
    path_arguments=("notebook_path",),
    rule_aliases=("Edit",),
    present_call=present_notebook_edit,
)
# Read rules (`Read(**/.env)`) also cover the tools that read files, as in Claude Code.
GLOB = _tool(
    "Glob",
    "Claude Code lists the files matching a glob pattern.",
    open_object({"pattern": {"type": "string", "minLength": 1}, "path": PATH}, ("pattern",)),
    read_only=True,
    path_arguments=("path", "pattern"),  # an absolute or ../ pattern reaches other files
    rule_aliases=("Read",),
)
GREP = _tool(
    "Grep",
    "Claude Code searches file contents for a regular expression (ripgrep).",
    open_object({"pattern": STRING, "path": PATH, "glob": STRING}, ("pattern",)),
    read_only=True,
    path_arguments=("path",),
    rule_aliases=("Read",),
)
LS = _tool(
    "LS",
    "Claude Code lists a directory.",
    open_object({"path": PATH, "ignore": {"type": "array", "items": STRING}}, ("path",)),
    read_only=True,
    path_arguments=("path",),
    rule_aliases=("Read",),
)
# Open-world: the request itself carries data off the machine (a URL, a query), so these
# are not read-only: standard mode asks, read_only mode denies, rules may allow them
# (`WebFetch(url:https://docs.python.org/*)`, `WebSearch`).
WEB_FETCH = _tool(
    "WebFetch",
    "Claude Code fetches a URL and reads it with a prompt.",
    open_object({"url": STRING, "prompt": STRING}, ("url",)),
    open_world=True,
)
WEB_SEARCH = _tool(
    "WebSearch",
    "Claude Code searches the web.",
    open_object(
        {
            "query": STRING,
            "allowed_domains": {"type": "array", "items": STRING},
            "blocked_domains": {"type": "array", "items": STRING},
        },
        ("query",),
    ),
    open_world=True,
)
_AGENT_PARAMETERS = open_object(
    {
        "description": STRING,
        "prompt": STRING,
        "subagent_type": STRING,
        # A remote agent runs in the cloud, where this machine's hooks never see its
        # tools: only local agents (each of whose tool calls comes through this hook).
        "isolation": {
            "enum": ["worktree"],
            "description": "Remote agents are not gated by Harness, so they are refused.",
        },
    },
    ("prompt",),
)
# A subagent changes nothing itself: each of its tool calls passes this hook.
AGENT = _tool("Agent", "Claude Code starts a subagent.", _AGENT_PARAMETERS, read_only=True)
TASK = _tool(
    "Task", "Claude Code starts a subagent (older name).", _AGENT_PARAMETERS, read_only=True
)
TODO_WRITE = _tool(
    "TodoWrite",
    "Claude Code updates its own todo list.",
    open_object({"todos": {"type": "array"}}, ("todos",)),
    read_only=True,
)

# Claude Code's own bookkeeping: they change nothing outside the Claude Code session.
SESSION_ONLY = (
    "AskUserQuestion",
    "BashOutput",
    "EnterPlanMode",
    "ExitPlanMode",
    "ListAgents",
    "ListMcpResourcesTool",
    "ReportFindings",
    "TaskCreate",
    "TaskGet",
    "TaskList",
    "TaskUpdate",
    "ToolSearch",
)
SESSION_TOOLS = tuple(
    _tool(name, f"Claude Code's {name} (its own state only).", open_object({}), read_only=True)
    for name in SESSION_ONLY
)

TOOLS: tuple[Tool, ...] = (
    BASH,
    MONITOR,
    READ,
    WRITE,
    EDIT,
    MULTI_EDIT,
    NOTEBOOK_EDIT,
    GLOB,
    GREP,
    LS,
    WEB_FETCH,
    WEB_SEARCH,
    AGENT,
    TASK,
    TODO_WRITE,
    *SESSION_TOOLS,
)


def _describe_mcp(name: str) -> str:
    server, _, tool = name[len("mcp__") :].partition("__")
    return f"The tool '{tool}' of the MCP server '{server}', run by Claude Code."


resolve_unknown, resolve_mcp = unlisted_fallbacks(
    client="Claude Code",
    mcp_name=MCP_NAME,
    tool_name=TOOL_NAME,
    describe_mcp=_describe_mcp,
    make_tool=_tool,
)

TOOLSET = ClientToolset(
    client=CLIENT, tools=TOOLS, fallback=resolve_unknown, rule_fallback=resolve_mcp
)
