"""An upstream MCP server for the sandbox tests, written with the `mcp` SDK (MCPServer):
it tries what it is asked to and says what happened, so a test sees from inside the
sandbox what a server can reach.

    python tests/support/mcp_files.py
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from mcp.server.mcpserver import MCPServer

server = MCPServer("files-test", log_level="WARNING")


def attempt(action: object) -> str:
    try:
        return "ok: " + str(action() if callable(action) else action)[:200]
    except OSError as error:
        return f"blocked: {type(error).__name__} {error.strerror}"


@server.tool(description="Read a file.")
def read(path: str) -> str:
    return attempt(lambda: Path(path).read_text())


@server.tool(description="Write a file.")
def write(path: str, text: str) -> str:
    return attempt(lambda: Path(path).write_text(text))


@server.tool(description="List a directory.")
def listdir(path: str) -> str:
    return attempt(lambda: sorted(os.listdir(path)))


@server.tool(description="Connect to a TCP port on the loopback.")
def connect(port: int) -> str:
    def dial() -> str:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return "connected"

    return attempt(dial)


@server.tool(description="Who the server runs as, and where.")
def whoami() -> str:
    return f"uid={os.getuid()} cwd={os.getcwd()}"


if __name__ == "__main__":
    server.run("stdio")
