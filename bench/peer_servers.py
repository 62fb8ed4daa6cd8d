"""The peer scenario's two servers that are not Harness (bench/peer.py), each its own process:

    python -m bench.peer_servers upstream PORT        FastMCP, a read-only `echo` tool
    python -m bench.peer_servers proxy PORT URL       FastMCP's proxy of URL, one session kept

Both serve Streamable HTTP at /mcp on 127.0.0.1 (uvicorn, FastMCP's defaults otherwise).
The proxy connects its client to the upstream once, before it serves, and hands that
connected client to `create_proxy`: FastMCP then reuses the one upstream session for every
request (its documented form, a URL, opens a new upstream session per request).
"""

from __future__ import annotations

import asyncio
import sys


def upstream(port: int) -> None:
    from fastmcp import FastMCP
    from mcp.types import ToolAnnotations

    server = FastMCP("bench-upstream")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    def echo(text: str) -> str:
        """Answer the text it was sent."""
        return text

    server.run(transport="http", host="127.0.0.1", port=port, log_level="error", show_banner=False)


async def proxy(port: int, url: str) -> None:
    from fastmcp import Client
    from fastmcp.server import create_proxy

    async with Client(url) as client:  # connected: the proxy reuses this one session
        server = create_proxy(client, name="bench-proxy")
        await server.run_async(
            transport="http", host="127.0.0.1", port=port, log_level="error", show_banner=False
        )


if __name__ == "__main__":
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "upstream":
        upstream(port)
    else:
        asyncio.run(proxy(port, sys.argv[3]))
