"""An upstream MCP server for tests, written with the `mcp` SDK (MCPServer).

    python tests/support/mcp_upstream.py stdio
    python tests/support/mcp_upstream.py http PORT

A test changes what it lists through the JSON file named by UPSTREAM_VARIANT_FILE, read
at start: {"echo_description": "...", "hide": ["pid"]} (a changed definition, a tool gone),
"echo_annotations": {...} (echo's annotations instead of readOnlyHint alone), "huge": true
(a tool `huge` answering that many megabytes).
`environment` answers the names of the variables the process got, `pid` its process id;
with UPSTREAM_CALLS_FILE, `slow` adds a line to that file as each call starts, and a
call of `slow` for N seconds waits first while the file `<UPSTREAM_CALLS_FILE>.hold-N`
exists (at most a minute), so a test holds a call until it has done its part.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

variant_file = Path(os.environ.get("UPSTREAM_VARIANT_FILE") or "/nonexistent")
VARIANT = json.loads(variant_file.read_text()) if variant_file.is_file() else {}
ECHO_DESCRIPTION = VARIANT.get("echo_description", "Echo the text back.")
HIDE = set(VARIANT.get("hide", []))
ECHO_ANNOTATIONS = ToolAnnotations(**VARIANT.get("echo_annotations", {"readOnlyHint": True}))

port = int(sys.argv[2]) if len(sys.argv) > 2 else 8000
server = MCPServer("upstream-test", log_level="WARNING")


@server.tool(description=ECHO_DESCRIPTION, annotations=ECHO_ANNOTATIONS)
def echo(text: str) -> str:
    return f"echo: {text}"


@server.tool(description="Write a note (changes things).")
def write_note(path: str, text: str) -> str:
    return f"noted {len(text)} characters for {path}"


@server.tool(
    description="Sleep for some seconds.", annotations=ToolAnnotations(read_only_hint=True)
)
def slow(seconds: float) -> str:
    if calls := os.environ.get("UPSTREAM_CALLS_FILE"):  # each call it started, a line
        with open(calls, "a") as started:
            started.write(f"slow {seconds}\n")
        hold, deadline = Path(f"{calls}.hold-{seconds}"), time.monotonic() + 60
        while hold.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    time.sleep(seconds)
    return f"slept {seconds}"


@server.tool(description="Exit the server process in the middle of the call.")
def crash() -> str:
    os._exit(3)


def pid() -> str:
    return str(os.getpid())


if "pid" not in HIDE:
    server.tool(
        description="The server's process id.", annotations=ToolAnnotations(read_only_hint=True)
    )(pid)


@server.tool(description="The names of the environment variables the server runs with.")
def environment() -> str:
    return ",".join(sorted(os.environ))


@server.tool(description="Fail with a tool error.")
def fail(reason: str) -> str:
    # (ToolError: the SDK's server shows the model its message; any other exception is
    # a crash it reports only as "Error executing tool fail")
    raise ToolError(f"upstream refused: {reason}")


if VARIANT.get("hostile"):  # what a hostile or broken server may list and answer

    def nul_result() -> str:
        return "before\x00after " + "x" * 50000

    server.tool(name="nul_result", description="Answers a NUL character and a lot.")(nul_result)
    server.tool(name="bad name!", description="A name no model SDK accepts.")(nul_result)
    server.tool(name="nul_description", description="Hidden\x00text.")(nul_result)


if VARIANT.get("huge"):  # a server answering one stdout line of any length

    def huge(megabytes: float) -> str:
        return "x" * int(megabytes * (1 << 20))

    server.tool(name="huge", description="Answers that many megabytes of text.")(huge)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=port)
    else:
        server.run("stdio")
