"""The ten stages of a call, in order, under their names.

    1 receive           admission.receive           web process (admission)
    2 resolve           policy.stages.resolve
    3 validate          policy.stages.validate
    4 pre_execute       policy.stages.pre_execute   settings.HARNESS_PRE_EXECUTE
    5 guards            policy.stages.guards        settings.HARNESS_GUARDS
    - wait              approvals                   a human, an expiry or a cancel
    6 execute           pipeline.execute            Celery worker (execution)
    7 project_content   pipeline.project_content
    8 post_execute      pipeline.post_execute       settings.HARNESS_POST_EXECUTE
    9 finalize_content  pipeline.finalize_content
   10 result            transitions.finish

Stages 2 to 5 write nothing and live with the policy (the simulator runs them too);
stages 6 to 9 are here and write nothing either; receive and result are state changes.
admission.submit_calls and execution.execute_call run them in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connections
from django.utils.module_loading import import_string

from dispatcher.policy.context import CallContext
from dispatcher.tools import messages
from dispatcher.tools.base import ExecutionContext, Tool, ToolError

logger = logging.getLogger(__name__)


def default_execute_wrapper(tool: Tool, ctx: ExecutionContext, arguments: dict[str, Any]) -> Any:
    """The place a deployment adds budgets, retries or metrics (none by default: principle 10)."""
    return tool.execute(ctx, arguments)


class Outcome:
    """What stage 6 produced: a value, a tool error, a crash, or a timeout."""

    def __init__(
        self, value: Any = None, error: BaseException | None = None, timed_out: bool = False
    ) -> None:
        self.value, self.error, self.timed_out = value, error, timed_out


# How long a body runs before the worker announces its call as running (`while_running`),
# and how long the result then waits for that notice to have gone out (so the two arrive
# in order) before it goes on without it.
RUNNING_NOTICE_AFTER = 0.05
NOTICE_JOIN = 1.0


def execute(
    tool: Tool,
    ctx: ExecutionContext,
    arguments: dict[str, Any],
    *,
    while_running: Callable[[], None] | None = None,
) -> Outcome:
    """Run the tool inside the execute wrapper with its host-only timeout.

    The tool's own timeout (e.g. run_command killing its process group) fires first; the
    wait is the backstop for a body that ignores it. The body runs on one of the process's
    tool runner threads (reused call after call, not a new one per call); a body that
    outlives its timeout keeps its thread, and the next call gets another runner.

    `while_running` is called once the body has run RUNNING_NOTICE_AFTER seconds and has
    not returned: the worker's wake-up saying the call is running. It runs on a thread of
    its own, so a publish that hangs (Redis unresponsive) never holds up the timeout's
    backstop. A body that returns sooner has nothing to announce: the result's wake-up
    follows at once.
    """
    wrapper = import_string(settings.HARNESS_EXECUTE_WRAPPER)
    ends = time.monotonic() + tool.timeout  # (ExecutionContext.deadline)
    ctx = dataclasses.replace(ctx, deadline=ends)
    outcome = Outcome()
    done = threading.Event()

    def target() -> None:
        threading.current_thread().name = f"tool-{ctx.call_id}"
        try:
            outcome.value = wrapper(tool, ctx, arguments)
        except BaseException as exc:  # noqa: BLE001 - every failure becomes an answer
            outcome.error = exc
        finally:
            done.set()

    deadline = ends + 1.0  # (the backstop)
    runner = _runner()
    runner.put(target)
    notice = None
    if while_running is not None and not done.wait(RUNNING_NOTICE_AFTER):
        notice = threading.Thread(
            target=_announce,
            args=(while_running, ctx.call_id),
            name=f"notice-{ctx.call_id}",
            daemon=True,
        )
        notice.start()
    if not done.wait(max(0.0, deadline - time.monotonic())):
        _retire(runner)  # (the hung body keeps its thread; nothing else is queued on it)
        outcome.timed_out = True
    else:
        _give_back(runner)
        outcome.timed_out = isinstance(outcome.error, TimeoutError)
    if notice is not None:
        notice.join(NOTICE_JOIN)
    return outcome


DEFAULT_EXECUTE_WRAPPER = "dispatcher.pipeline.default_execute_wrapper"


def runs_on_loop(tool: Tool) -> bool:
    """Whether a call of `tool` run inline is awaited on its request's loop
    (`execute_async`): its tool has an async body, and no deployment's execute wrapper is
    set, which wraps `execute` only; with one set, every call runs through it."""
    return tool.execute_async is not None and (
        settings.HARNESS_EXECUTE_WRAPPER == DEFAULT_EXECUTE_WRAPPER
    )


async def execute_async(
    tool: Tool,
    ctx: ExecutionContext,
    arguments: dict[str, Any],
    *,
    while_running: Callable[[], None] | None = None,
) -> Outcome:
    """`execute` for a body awaited on the running loop (`runs_on_loop`): the same
    timeout, its backstop a second later (the body is then cancelled and left), the same
    running notice on a thread of its own. The loop is never blocked: nothing here waits
    but on the loop."""
    assert tool.execute_async is not None
    loop = asyncio.get_running_loop()
    ends = time.monotonic() + tool.timeout  # (ExecutionContext.deadline)
    ctx = dataclasses.replace(ctx, deadline=ends, loop=loop)
    outcome = Outcome()
    body = asyncio.ensure_future(tool.execute_async(ctx, arguments))
    noticed: asyncio.Future[None] | None = None
    if while_running is not None:
        await asyncio.wait({body}, timeout=RUNNING_NOTICE_AFTER)
        if not body.done():
            noticed = loop.create_future()
            threading.Thread(
                target=_announce_then,
                args=(while_running, ctx.call_id, loop, noticed),
                name=f"notice-{ctx.call_id}",
                daemon=True,
            ).start()
    await asyncio.wait({body}, timeout=max(0.0, ends + 1.0 - time.monotonic()))
    if not body.done():  # (the backstop: the body ignored its timeout)
        body.cancel()
        body.add_done_callback(_forget)
        outcome.timed_out = True
    elif body.cancelled():
        outcome.error = RuntimeError("its body was cancelled")
    else:
        outcome.error = body.exception()
        outcome.value = None if outcome.error is not None else body.result()
        outcome.timed_out = isinstance(outcome.error, TimeoutError)
    if noticed is not None:
        await asyncio.wait({noticed}, timeout=NOTICE_JOIN)
    return outcome


def _forget(body: asyncio.Future[Any]) -> None:
    """A body cancelled at its backstop: whatever it ended with is not read."""
    if not body.cancelled():
        body.exception()


def _announce_then(
    while_running: Callable[[], None],
    call_id: str,
    loop: asyncio.AbstractEventLoop,
    noticed: asyncio.Future[None],
) -> None:
    """`_announce`, then `noticed` set on `loop` (unless it has closed meanwhile)."""
    try:
        _announce(while_running, call_id)
    finally:
        with contextlib.suppress(RuntimeError):  # (the loop closed)
            loop.call_soon_threadsafe(_settle, noticed)


def _settle(noticed: asyncio.Future[None]) -> None:
    if not noticed.done():
        noticed.set_result(None)


def _announce(while_running: Callable[[], None], call_id: str) -> None:
    try:
        while_running()
    except Exception:  # a lost notice must not lose the body's outcome
        logger.warning("could not announce call %s as running", call_id, exc_info=True)
    finally:
        connections.close_all()  # (this thread's own, if a receiver of the notice read)


class _Runner:
    """A daemon thread running queued bodies one at a time, for one process (a forked
    child starts its own: threads do not survive fork)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="tool-runner", daemon=True).start()

    def put(self, job: Callable[[], None] | None) -> None:
        self.jobs.put(job)

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:  # None: retired, end after the body
            job()


# The process's idle runners: a call takes one (or starts one) and gives it back when its
# body returned in time. A worker's one waiting thread reuses one runner call after call;
# a web process running calls inline on its threads (execution.run_inline, under a
# deployment's execute wrapper: runs_on_loop) keeps as many as ran at once, never one
# per request.
_idle: list[_Runner] = []
_idle_lock = threading.Lock()


def _runner() -> _Runner:
    with _idle_lock:
        while _idle:
            runner = _idle.pop()
            if runner.pid == os.getpid():
                return runner
    return _Runner()


def _give_back(runner: _Runner) -> None:
    with _idle_lock:
        _idle.append(runner)


def _retire(runner: _Runner) -> None:
    """Leave `runner` to its hung body, and its thread to end when the body does (it is
    not given back: the next call takes another runner)."""
    runner.put(None)


def project_content(tool: Tool, outcome: Outcome) -> tuple[str, bool]:
    """Turn the outcome into model-facing content and is_error."""
    if isinstance(outcome.error, ToolError):
        return str(outcome.error), True
    if outcome.error is not None:
        logger.error("tool %s raised", tool.name, exc_info=outcome.error)
        return messages.tool_crashed(tool.name, outcome.error), True
    return tool.project_content(outcome.value), False


def post_execute(call: CallContext, content: str) -> str:
    for path in settings.HARNESS_POST_EXECUTE:
        content = import_string(path)(call, content)
    return content


def finalize_content(tool: Tool, content: str, *, repeat_count: int, raw_arguments: str) -> str:
    return tool.finalize_content(content) + messages.repeat_reminder(
        repeat_count, tool.name, raw_arguments
    )
