"""Stage 6's runner (dispatcher.pipeline.execute): the tool body runs on a thread the
process reuses call after call; a body past its timeout keeps its thread, is answered as
timed out, and the next call runs on a new runner without waiting for it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dispatcher import pipeline
from dispatcher.tools.base import ExecutionContext, Tool, ToolError

PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": True}


def tool(body: Any, timeout: float = 2.0) -> Tool:
    return Tool(name="t", description="test", parameters=PARAMETERS, execute=body, timeout=timeout)


def context(call_id: str, tmp_path: Path, timeout: float = 2.0) -> ExecutionContext:
    return ExecutionContext(
        workspace=tmp_path, call_id=call_id, timeout=timeout, output_limit=1000, raw_arguments="{}"
    )


def test_calls_run_on_one_reused_thread_named_for_the_call(tmp_path: Path) -> None:
    seen: list[tuple[int, str]] = []

    def body(ctx: ExecutionContext, args: dict[str, Any]) -> str:
        current = threading.current_thread()
        seen.append((current.ident or 0, current.name))
        return "ok"

    for n in range(3):
        outcome = pipeline.execute(tool(body), context(f"c{n}", tmp_path), {})
        assert outcome.value == "ok" and outcome.error is None and not outcome.timed_out
    assert len({ident for ident, _ in seen}) == 1, seen  # one thread, reused
    assert seen[0][0] != threading.get_ident()  # not the caller's
    assert [name for _, name in seen] == ["tool-c0", "tool-c1", "tool-c2"]


def test_errors_become_the_outcome_and_the_runner_keeps_going(tmp_path: Path) -> None:
    def fails(ctx: ExecutionContext, args: dict[str, Any]) -> str:
        raise ToolError("no such file")

    def crashes(ctx: ExecutionContext, args: dict[str, Any]) -> str:
        raise SystemExit(3)  # even this is an answer, not the end of the runner

    assert isinstance(pipeline.execute(tool(fails), context("e1", tmp_path), {}).error, ToolError)
    assert isinstance(
        pipeline.execute(tool(crashes), context("e2", tmp_path), {}).error, SystemExit
    )
    ok = pipeline.execute(tool(lambda ctx, args: "after"), context("e3", tmp_path), {})
    assert ok.value == "after" and ok.error is None


def test_a_body_past_its_timeout_is_left_behind_and_the_next_call_gets_a_new_runner(
    tmp_path: Path,
) -> None:
    release = threading.Event()
    threads: list[int] = []
    hung: list[threading.Thread] = []

    def hangs(ctx: ExecutionContext, args: dict[str, Any]) -> str:
        threads.append(threading.get_ident())
        hung.append(threading.current_thread())
        release.wait(30)  # ignores its own timeout (held 30 s: a runner waiting for it would)
        return "too late"

    started = time.monotonic()
    outcome = pipeline.execute(tool(hangs, timeout=0.1), context("h", tmp_path, 0.1), {})
    assert outcome.timed_out and outcome.value is None
    # The backstop (its timeout + 1 s), not the body's 30 s (3 s once: a loaded host's
    # thread start and join outlast that)
    assert time.monotonic() - started < 10

    def quick(ctx: ExecutionContext, args: dict[str, Any]) -> str:
        threads.append(threading.get_ident())
        return "next"

    try:
        began = time.monotonic()
        nxt = pipeline.execute(tool(quick), context("n", tmp_path), {})
        assert nxt.value == "next" and not nxt.timed_out
        assert time.monotonic() - began < 10  # not queued behind the hung body (30 s)
        assert threads[0] != threads[1]
    finally:
        release.set()
    # The left-behind thread ends once its body returns (it is not kept idle forever).
    hung[0].join(5)
    assert not hung[0].is_alive()


def test_the_running_notice_comes_while_the_body_runs_and_a_failing_one_loses_nothing(
    tmp_path: Path,
) -> None:
    seen: list[str] = []

    def body(ctx: ExecutionContext, args: dict[str, Any]) -> str:
        time.sleep(args["seconds"])
        seen.append("returned")
        return "done"

    def notice() -> None:
        seen.append("notice")
        raise RuntimeError("Redis is gone")

    quick = pipeline.execute(
        tool(body), context("n", tmp_path), {"seconds": 0}, while_running=notice
    )
    assert (quick.value, seen) == ("done", ["returned"])
    seen.clear()
    slow = pipeline.execute(
        tool(body),
        context("n", tmp_path),
        {"seconds": pipeline.RUNNING_NOTICE_AFTER * 4},
        while_running=notice,
    )
    assert (slow.value, slow.error, slow.timed_out) == ("done", None, False)
    assert seen == ["notice", "returned"]


@pytest.mark.heavy
def test_a_notice_that_hangs_holds_up_neither_the_timeout_nor_the_result(tmp_path: Path) -> None:
    """Redis unresponsive: the notice's publish blocks, and the backstop still fires on time."""
    release, unblock = threading.Event(), threading.Event()

    def hangs(ctx: ExecutionContext, args: dict[str, Any]) -> str:
        release.wait(30)
        return "too late"

    began = time.monotonic()
    try:
        outcome = pipeline.execute(
            tool(hangs, timeout=0.2),
            context("hn", tmp_path, 0.2),
            {},
            while_running=lambda: unblock.wait(30),
        )
        took = time.monotonic() - began
        assert outcome.timed_out
        # the timeout and its 1 s backstop, then at most NOTICE_JOIN for the notice, not the
        # notice's 30 s hang (5 s of room for a loaded host, not 0.5)
        assert took < 0.2 + 1.0 + pipeline.NOTICE_JOIN + 5.0, took
        done = pipeline.execute(
            tool(lambda ctx, args: "quick"), context("hq", tmp_path), {}, while_running=unblock.wait
        )
        assert done.value == "quick"
    finally:
        release.set()
        unblock.set()


def test_waiting_threads_share_the_processs_runners(tmp_path: Path) -> None:
    """Many short-lived waiting threads (a web process's requests running calls inline)
    take runners from the process's idle ones: as many runner threads as ran at once,
    never one per waiting thread."""
    runners: set[int] = set()
    lock = threading.Lock()
    gate = threading.Barrier(3)

    def body(ctx: ExecutionContext, args: dict[str, Any]) -> str:
        with lock:
            runners.add(threading.get_ident())
        return "ok"

    def blocking(ctx: ExecutionContext, args: dict[str, Any]) -> str:
        body(ctx, args)
        gate.wait(5)  # three bodies at once: three runners
        return "ok"

    def request(n: int, fn: Any) -> None:
        outcome = pipeline.execute(tool(fn), context(f"r{n}", tmp_path), {})
        assert outcome.value == "ok", outcome.error

    for _ in range(2):
        threads = [threading.Thread(target=request, args=(i, blocking)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    for i in range(20):  # one request thread after another, each new
        t = threading.Thread(target=request, args=(100 + i, body))
        t.start()
        t.join(10)
    assert len(runners) == 3, runners
