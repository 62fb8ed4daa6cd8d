"""A tool the client runs that Harness has no definition of (decide-only).

Claude Code's permission prompt (`approval_prompt` on the MCP gateway) asks about tools
by the client's own names. A name the registry knows as a client-executed tool is asked
about as itself; any other name is asked about as a call of this tool, with the client's
tool name and input as its arguments, so rules can still name it
(`client_tool(tool_name:Bash)`) and no mode reads it as read-only.
"""

from __future__ import annotations

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
