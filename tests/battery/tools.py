"""Tools only the battery registers (HARNESS_EXTRA_TOOLS in the processes it starts):
short timeouts, so that a lost lease ends within seconds, and effects that can be counted."""

from __future__ import annotations

import time
from typing import Any

from dispatcher.tools.base import ExecutionContext, Tool

_PARAMETERS = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "delay": {"type": "number", "minimum": 0, "maximum": 5},
    },
    "required": ["path"],
    "additionalProperties": False,
}


def _keyed_write(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """Idempotent: the file named by the key holds the same bytes however often it runs."""
    time.sleep(args.get("delay", 0))
    target = ctx.workspace / args["path"]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"{ctx.call_id}\n")
    return "written"


def _marker(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """Not idempotent: every run appends one line, so runs can be counted."""
    time.sleep(args.get("delay", 0))
    target = ctx.workspace / args["path"]
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("a") as out:
        out.write(f"{ctx.call_id}\n")
    return "appended"


KEYED_WRITE = Tool(
    name="battery_keyed_write",
    description="Write the call id to a file named by its key (battery only; idempotent).",
    parameters=_PARAMETERS,
    execute=_keyed_write,
    timeout=2.0,
    read_only=False,
    path_arguments=("path",),
)

MARKER = Tool(
    name="battery_marker",
    description="Append the call id to a file (battery only; each run adds a line).",
    parameters=_PARAMETERS,
    execute=_marker,
    timeout=2.0,
    read_only=False,
    path_arguments=("path",),
)

EXTRA_TOOLS = "tests.battery.tools.KEYED_WRITE,tests.battery.tools.MARKER"
