"""A tiny upstream MCP server bundled for `make demo` (stdio; the `mcp` SDK's MCPServer).

`manage.py run_demo` registers it as the server `demo` (annotations trusted), so its
read-only `word_count` runs in standard mode without asking and `shout` asks a reviewer:

    python demo/mcp_server.py
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("harness-demo", log_level="WARNING")


@server.tool(
    description="Count the words, lines and characters of a text.",
    annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
)
def word_count(text: str) -> str:
    return f"{len(text.split())} words, {len(text.splitlines())} lines, {len(text)} characters"


@server.tool(description="Say a text loudly (a tool that is not read-only: standard mode asks).")
def shout(text: str) -> str:
    return text.upper() + "!"


if __name__ == "__main__":
    server.run("stdio")
