"""Bench-only tool: a no-op, registered with HARNESS_EXTRA_TOOLS="bench.tools.NOOP" (S6)."""

from __future__ import annotations

from typing import Any

from dispatcher.tools.base import ExecutionContext, Tool


def noop(ctx: ExecutionContext, args: dict[str, Any]) -> str:
    return "ok"


NOOP = Tool(
    name="bench_noop",
    description="Does nothing and answers 'ok'. Benchmarks only.",
    parameters={
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "additionalProperties": False,
    },
    execute=noop,
    read_only=True,
    is_concurrency_safe=True,
)
