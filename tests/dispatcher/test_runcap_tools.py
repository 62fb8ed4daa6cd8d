"""A tool the running-cap tests register in the processes they start (HARNESS_EXTRA_TOOLS):
its call runs until the test lets it end, so that "still running" does not depend on a
clock. (No tests here.)"""

from __future__ import annotations

import time
from typing import Any

from dispatcher.tools.base import ExecutionContext, Tool


def _wait_for(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """Runs until the file `path` exists in the workspace (or its timeout ends it)."""
    target = ctx.workspace / args["path"]
    ends = ctx.deadline or time.monotonic() + WAIT_FOR.timeout
    while not target.exists():
        if time.monotonic() > ends:
            return "not released"
        time.sleep(0.02)
    return "released"


WAIT_FOR = Tool(
    name="runcap_wait_for",
    description="Run until a file appears in the workspace (tests only).",
    parameters={
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
        "additionalProperties": False,
    },
    execute=_wait_for,
    timeout=20.0,
    read_only=False,
    path_arguments=("path",),
)

EXTRA_TOOLS = "tests.dispatcher.test_runcap_tools.WAIT_FOR,tests.battery.tools.MARKER"
