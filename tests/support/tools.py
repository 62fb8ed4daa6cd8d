"""Tools that exist only in tests: slow, observable, with short timeouts."""

from __future__ import annotations

import json
import time
from typing import Any

from dispatcher.tools.base import ExecutionContext, Tool


def _sleep(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """Sleep, and log start and end times to the workspace so tests can see overlap."""
    start = time.time()
    time.sleep(args["seconds"])
    with (ctx.workspace / "sleep-log.jsonl").open("a") as log:
        log.write(
            json.dumps({"tag": args.get("tag", ""), "start": start, "end": time.time()}) + "\n"
        )
    return f"slept {args['seconds']}s"


SLEEP = Tool(
    name="sleep",
    description="Sleep for some seconds (tests only).",
    parameters={
        "type": "object",
        "properties": {
            "seconds": {"type": "number", "minimum": 0, "maximum": 30},
            "tag": {"type": "string"},
        },
        "required": ["seconds"],
        "additionalProperties": False,
    },
    execute=_sleep,
    timeout=3.0,
    is_concurrency_safe=True,
    read_only=True,
)


def _slow_write(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    """Append a line to a file after a delay: a side effect tests can count."""
    time.sleep(args.get("delay", 0))
    with (ctx.workspace / args["path"]).open("a") as out:
        out.write(args["line"] + "\n")
    return "appended"


SLOW_WRITE = Tool(
    name="slow_append",
    description="Append a line to a file after a delay (tests only).",
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "line": {"type": "string"},
            "delay": {"type": "number", "minimum": 0, "maximum": 30},
        },
        "required": ["path", "line"],
        "additionalProperties": False,
    },
    execute=_slow_write,
    timeout=2.0,
    is_concurrency_safe=False,
    read_only=False,
    path_arguments=("path",),
)


CLIENT_NOTE = Tool(
    name="client_note",
    description="Write a note on the client's machine (tests only: the client runs it).",
    parameters={
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    },
    client_executed=True,
)
