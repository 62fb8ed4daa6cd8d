"""Gemini CLI's tools, as decide-only Harness tools (the client runs them).

Gemini CLI runs its BeforeTool hooks before every tool it executes; these are its
built-in tools by their own names and parameters (@google/gemini-cli 0.61.0:
packages/core/src/tools/definitions). They exist only for Gemini CLI sessions (`TOOLSET`,
named in settings.HARNESS_CLIENT_TOOLS).

`run_shell_command` is one shell string Gemini CLI runs with `bash -c`, read by the same
command reader and blocklist as Claude Code's `Bash`; its `dir_path` is confined like
every path here: lexically, to the session's project directory (the hook's cwd). Reads are
read-only; writes, the shell, and the open-world tools (web_fetch, google_web_search) ask
in standard mode. A name not listed resolves to a generic tool that asks (MCP tools are
named `mcp_<server>_<tool>` by Gemini CLI and are open-world).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dispatcher.tools.base import ClientToolset, Tool, open_object, unlisted_fallbacks
from dispatcher.tools.claude_code import TOOL_NAME, present_bash, present_edit, present_write

CLIENT = "gemini-cli"
MCP_PREFIX = re.compile(r"^mcp_[A-Za-z0-9_.-]{1,200}$")

STRING: dict[str, Any] = {"type": "string"}
PATH: dict[str, Any] = {"type": "string", "description": "A path on the client."}
BOOLEAN: dict[str, Any] = {"type": "boolean"}
NUMBER: dict[str, Any] = {"type": "number"}
STRINGS: dict[str, Any] = {"type": "array", "items": {"type": "string"}}


def _tool(name: str, description: str, parameters: dict[str, Any], **host: Any) -> Tool:
    return Tool(
        name=name, description=description, parameters=parameters, client_executed=True, **host
    )


def _included_paths(arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """read_many_files' `include`: paths or globs, each of which must stay in the project."""
    include = arguments.get("include", [])
    if not isinstance(include, list) or not all(isinstance(p, str) for p in include):
        raise ValueError("'include' must be a list of paths or glob patterns")
    return tuple(include)


RUN_SHELL_COMMAND = _tool(
    "run_shell_command",
    "Gemini CLI runs a shell command (one string, with bash -c) on the developer's machine.",
    open_object(
        {
            "command": {"type": "string", "minLength": 1},
            "description": STRING,
            "dir_path": PATH,
            "is_background": BOOLEAN,
        },
        ("command",),
    ),
    command_argument="command",
    command_shell="bash",
    path_arguments=("dir_path",),
    open_world=True,
    present_call=present_bash,
)
# Read rules (`read_file(**/.env)`) also cover the tools that read files.
READ_FILE = _tool(
    "read_file",
    "Gemini CLI reads a file.",
    open_object({"file_path": PATH, "start_line": NUMBER, "end_line": NUMBER}, ("file_path",)),
    read_only=True,
    path_arguments=("file_path",),
)
READ_MANY_FILES = _tool(
    "read_many_files",
    "Gemini CLI reads the files matching paths or glob patterns.",
    open_object(
        {
            "include": STRINGS,
            "exclude": STRINGS,
            "recursive": BOOLEAN,
            "useDefaultExcludes": BOOLEAN,
        },
        ("include",),
    ),
    read_only=True,
    embedded_paths=_included_paths,
    rule_aliases=("read_file",),
)
LIST_DIRECTORY = _tool(
    "list_directory",
    "Gemini CLI lists a directory.",
    open_object({"dir_path": PATH, "ignore": STRINGS}, ("dir_path",)),
    read_only=True,
    path_arguments=("dir_path",),
    rule_aliases=("read_file",),
)
GLOB = _tool(
    "glob",
    "Gemini CLI lists the files matching a glob pattern.",
    open_object(
        {
            "pattern": {"type": "string", "minLength": 1},
            "dir_path": PATH,
            "case_sensitive": BOOLEAN,
        },
        ("pattern",),
    ),
    read_only=True,
    path_arguments=("dir_path", "pattern"),  # an absolute or ../ pattern reaches other files
    rule_aliases=("read_file",),
)
GREP_SEARCH = _tool(
    "grep_search",
    "Gemini CLI searches file contents for a regular expression.",
    open_object(
        {"pattern": STRING, "dir_path": PATH, "include_pattern": STRING, "exclude_pattern": STRING},
        ("pattern",),
    ),
    read_only=True,
    path_arguments=("dir_path",),
    rule_aliases=("read_file",),
)
WRITE_FILE = _tool(
    "write_file",
    "Gemini CLI creates or overwrites a file with the whole new content.",
    open_object({"file_path": PATH, "content": STRING}, ("file_path", "content")),
    path_arguments=("file_path",),
    rule_aliases=("replace",),
    present_call=present_write,
)
REPLACE = _tool(
    "replace",
    "Gemini CLI replaces old_string with new_string in a file.",
    open_object(
        {
            "file_path": PATH,
            "instruction": STRING,
            "old_string": STRING,
            "new_string": STRING,
            "allow_multiple": BOOLEAN,
        },
        ("file_path", "old_string", "new_string"),
    ),
    path_arguments=("file_path",),
    present_call=present_edit,
)
# Open-world: the request itself carries data off the machine (URLs in the prompt, a query).
WEB_FETCH = _tool(
    "web_fetch",
    "Gemini CLI fetches the URLs in a prompt and reads them.",
    open_object({"prompt": STRING}, ("prompt",)),
    open_world=True,
)
GOOGLE_WEB_SEARCH = _tool(
    "google_web_search",
    "Gemini CLI searches the web.",
    open_object({"query": STRING}, ("query",)),
    open_world=True,
)
# Writes Gemini CLI's memory file in the user's home, outside the project.
SAVE_MEMORY = _tool(
    "save_memory",
    "Gemini CLI saves a fact to its memory file (~/.gemini/GEMINI.md).",
    open_object({"fact": STRING}, ("fact",)),
)

# Gemini CLI's own bookkeeping: they change nothing outside the Gemini CLI session.
SESSION_ONLY = (
    "activate_skill",
    "ask_user",
    "complete_task",
    "enter_plan_mode",
    "exit_plan_mode",
    "get_internal_docs",
    "list_background_processes",  # Gemini CLI's own background shells: what they printed
    "read_background_output",
    "tracker_add_dependency",
    "tracker_create_task",
    "tracker_get_task",
    "tracker_list_tasks",
    "tracker_update_task",
    "tracker_visualize",
    "update_topic",
    "write_todos",
)
SESSION_TOOLS = tuple(
    _tool(name, f"Gemini CLI's {name} (its own state only).", open_object({}), read_only=True)
    for name in SESSION_ONLY
)

TOOLS: tuple[Tool, ...] = (
    RUN_SHELL_COMMAND,
    READ_FILE,
    READ_MANY_FILES,
    LIST_DIRECTORY,
    GLOB,
    GREP_SEARCH,
    WRITE_FILE,
    REPLACE,
    WEB_FETCH,
    GOOGLE_WEB_SEARCH,
    SAVE_MEMORY,
    *SESSION_TOOLS,
)


resolve_unknown, resolve_mcp = unlisted_fallbacks(
    client="Gemini CLI",
    mcp_name=MCP_PREFIX,
    tool_name=TOOL_NAME,
    describe_mcp=lambda name: f"The MCP tool '{name}', run by Gemini CLI.",
    make_tool=_tool,
)

TOOLSET = ClientToolset(
    client=CLIENT, tools=TOOLS, fallback=resolve_unknown, rule_fallback=resolve_mcp
)
