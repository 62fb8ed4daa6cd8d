"""Stage 6 for a body awaited on the request's loop (dispatcher.pipeline.execute_async,
the inline lane's: Tool.execute_async): the same outcomes as the runner thread's, the same
host-only timeout and backstop, the same running notice on a thread of its own; and the
loop is never blocked meanwhile (a ticker on the same loop keeps ticking)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from dispatcher import pipeline
from dispatcher.tools.base import ExecutionContext, Tool, ToolError

PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": True}

Body = Callable[[ExecutionContext, dict[str, Any]], Awaitable[Any]]


def tool(body: Body, timeout: float = 2.0) -> Tool:
    return Tool(
        name="t", description="test", parameters=PARAMETERS, execute_async=body, timeout=timeout
    )


def context(call_id: str, tmp_path: Path) -> ExecutionContext:
    return ExecutionContext(
        workspace=tmp_path, call_id=call_id, timeout=2.0, output_limit=1000, raw_arguments="{}"
    )


async def ticking[T](work: Awaitable[T]) -> tuple[T, int]:
    """`work`'s result, and how often a ticker on the same loop ran meanwhile (every 10 ms)."""
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    try:
        return await work, ticks
    finally:
        stop.set()
        await task


def test_values_and_errors_become_the_outcome(tmp_path: Path) -> None:
    async def value(ctx: ExecutionContext, args: dict[str, Any]) -> str:
        assert ctx.loop is asyncio.get_running_loop() and ctx.deadline is not None
        return "done"

    async def fails(ctx: ExecutionContext, args: dict[str, Any]) -> str:
        raise ToolError("told the model")

    async def crashes(ctx: ExecutionContext, args: dict[str, Any]) -> str:
        raise KeyError("bug")

    async def times_out(ctx: ExecutionContext, args: dict[str, Any]) -> str:
        raise TimeoutError("the server did not answer")

    async def run(body: Body) -> pipeline.Outcome:
        return await pipeline.execute_async(tool(body), context("c", tmp_path), {})

    ok = asyncio.run(run(value))
    assert (ok.value, ok.error, ok.timed_out) == ("done", None, False)
    assert isinstance(asyncio.run(run(fails)).error, ToolError)
    assert isinstance(asyncio.run(run(crashes)).error, KeyError)
    late = asyncio.run(run(times_out))
    assert late.timed_out and isinstance(late.error, TimeoutError)


def test_a_body_that_ignores_its_timeout_is_cancelled_at_the_backstop_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    ended: list[str] = []

    async def hangs(ctx: ExecutionContext, args: dict[str, Any]) -> str:
        try:
            await asyncio.sleep(30)
        finally:
            ended.append("cancelled")
        return "too late"

    async def run() -> tuple[pipeline.Outcome, int]:
        outcome = pipeline.execute_async(tool(hangs, timeout=0.2), context("h", tmp_path), {})
        result = await ticking(outcome)
        await asyncio.sleep(0)  # (the cancelled body's own ending)
        return result

    began = time.monotonic()
    outcome, ticks = asyncio.run(run())
    took = time.monotonic() - began
    assert outcome.timed_out and outcome.value is None
    assert ended == ["cancelled"]
    assert took >= 1.2 - 0.05  # (not before the timeout and its backstop)
    assert ticks >= 10, ticks  # the loop served others while the body hung


def test_the_running_notice_comes_while_the_body_runs_and_one_that_hangs_blocks_nothing(
    tmp_path: Path,
) -> None:
    """A quick body has no notice; a slow one's comes before it returns; a notice that
    hangs (Redis unresponsive) holds the result up by at most NOTICE_JOIN, and the loop
    keeps serving meanwhile."""
    seen: list[str] = []
    unblock = threading.Event()

    async def body(ctx: ExecutionContext, args: dict[str, Any]) -> str:
        await asyncio.sleep(args["seconds"])
        seen.append("returned")
        return "done"

    def notice() -> None:
        seen.append("notice")

    def hangs() -> None:
        seen.append("hangs")
        unblock.wait(30)

    async def run(arguments: dict[str, Any], while_running: Callable[[], None]) -> Any:
        work = pipeline.execute_async(
            tool(body), context("n", tmp_path), arguments, while_running=while_running
        )
        return await ticking(work)

    quick, _ = asyncio.run(run({"seconds": 0}, notice))
    assert (quick.value, seen) == ("done", ["returned"])
    seen.clear()
    slow, _ = asyncio.run(run({"seconds": pipeline.RUNNING_NOTICE_AFTER * 4}, notice))
    assert (slow.value, slow.error, slow.timed_out) == ("done", None, False)
    assert seen == ["notice", "returned"]
    seen.clear()
    try:
        began = time.monotonic()
        held, ticks = asyncio.run(run({"seconds": pipeline.RUNNING_NOTICE_AFTER * 2}, hangs))
        took = time.monotonic() - began
        assert (held.value, seen) == ("done", ["hangs", "returned"])
        # NOTICE_JOIN's wait, not the notice's 30 s hang (5 s of room for a loaded host)
        assert took < pipeline.NOTICE_JOIN + 5.0, took
        assert ticks >= 20, ticks
    finally:
        unblock.set()
