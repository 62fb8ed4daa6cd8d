"""A tool the client runs that Harness has no definition of (decide-only).

Claude Code's permission prompt (`approval_prompt` on the MCP gateway) asks about tools
by the client's own names. A name the registry knows as a client-executed tool is asked
about as itself; any other name is asked about as a call of this tool, with the client's
tool name and input as its arguments, so rules can still name it
(`client_tool(tool_name:Bash)`) and no mode reads it as read-only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.tools.base import Tool

TOOL = Tool(
    name="client_tool",
    description=(
        "A tool the client runs itself (asked about through a permission prompt). "
        "Harness decides whether it may run; it never runs it."
    ),
    parameters={
        "type": "object",
        "properties": {
            "tool_name": {"type": "string", "minLength": 1, "maxLength": 200},
            "input": {"type": "object"},
        },
        "required": ["tool_name", "input"],
        "additionalProperties": False,
    },
    client_executed=True,
)


def named_tools(tool: Tool, arguments: Mapping[str, Any]) -> list[tuple[Tool, dict[str, Any]]]:
    """For a call of this tool: each client tool set's own tool of the name it asks about,
    with the input (Claude Code's `Bash` and Codex's, with `{"command": ...}`), so that
    the guards read it as they read that tool's calls through its hook (the command
    blocklist holds on every mode, whichever way a command is asked about). A name no
    tool set lists is each tool set's tool for an unlisted name (`toolset.fallback`: Claude
    Code's `Artifact`, whose input's paths are then confined as through its hook; an MCP
    tool, whose deny and ask rules then hold). Empty for any other tool."""
    from dispatcher.tools import registry  # (the registry names this tool)

    name, tool_input = arguments.get("tool_name"), arguments.get("input")
    if tool is not TOOL or not isinstance(name, str) or not isinstance(tool_input, dict):
        return []
    toolsets = registry.client_toolsets()
    listed = [named for toolset in toolsets for named in toolset.tools if named.name == name]
    if not listed:
        listed = [named for toolset in toolsets if (named := toolset.fallback(name)) is not None]
    return [(named, tool_input) for named in listed]
