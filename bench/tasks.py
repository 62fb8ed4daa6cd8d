"""Bench-only Celery tasks (the bench worker imports them with `-I bench.tasks`).

Results travel by Redis pub/sub, like the product's wake-ups: no result backend, no polling.
"""

from __future__ import annotations

import functools
from typing import Any

import redis
from celery import shared_task
from django.conf import settings


@functools.cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


@shared_task(name="bench.tasks.noop", ignore_result=True)
def noop(channel: str) -> None:
    """S5 baseline: a no-op whose completion is published on `channel`."""
    _redis().publish(channel, "done")


@shared_task(name="bench.tasks.noop_count", ignore_result=True)
def noop_count(key: str, n: int) -> None:
    """S6 baseline: a no-op that counts itself; the n-th publishes on `key` (one INCR each)."""
    r = _redis()
    if r.incr(key) == n:
        r.publish(key, "done")


@shared_task(name="bench.tasks.floor_execute", ignore_result=True)
def floor_execute(call_id: str, chain: str, channel: str) -> None:
    """S5/S6 floor: the claim and the result as durable transitions, then one wake-up."""
    from bench import floor

    floor.transition(call_id, chain, "queued", "running")
    floor.transition(call_id, chain, "running", "completed")
    _redis().publish(channel, f"{call_id} completed")


def _rechecked(call_id: str) -> tuple[Any, Any]:
    """Stage 6 before the claim as Harness's worker makes it (execution.execute_call): the
    call read with its session, agent, owner's profile and the policy layers' revisions
    (its compiled read), its policy context, the guards re-run."""
    import uuid

    from dispatcher.admission import call_context
    from dispatcher.agents import mode_and_profile
    from dispatcher.execution import _CALL_WITH_SESSION
    from dispatcher.policy import layers, stages

    call = _CALL_WITH_SESSION.first(uuid.UUID(call_id))
    if call is None:
        raise RuntimeError(f"call {call_id} not found")
    session = call.session
    revisions = layers.revisions_of(call)
    ctx = call_context(
        call, session, *mode_and_profile(session, preloaded=True, revisions=revisions)
    )
    if ctx is None or stages.guards(ctx):
        raise RuntimeError(f"call {call_id}: its tool is gone or a guard denies it")
    return call, ctx


@shared_task(name="bench.tasks.floor_execute_checked", ignore_result=True)
def floor_execute_checked(call_id: str, chain: str, channel: str) -> None:
    """S0's, S5's and S6's G: the floor with stage 6 as Harness's worker makes it
    (dispatcher.execution.execute_call): the call read with its session, agent, owner's
    profile and the policy layers' revisions (its compiled read), its policy context, the
    guards re-run before the claim; after the floor's claim, the tool's body run and its
    content projected; then the floor's result and wake-up."""
    from bench import floor
    from dispatcher import pipeline
    from dispatcher.execution import _execution_context

    call, ctx = _rechecked(call_id)
    floor.transition(call_id, chain, "queued", "running")
    # the tool's body as the worker runs it (the execute wrapper and the host-only timeout
    # on the tool runner's thread), and its content projected (not written: the floor's
    # result transition writes the status)
    outcome = pipeline.execute(ctx.tool, _execution_context(call, ctx, None), call.arguments or {})
    pipeline.project_content(ctx.tool, outcome)
    floor.transition(call_id, chain, "running", "completed")
    _redis().publish(channel, f"{call_id} completed")


class _BodyTimedOut(Exception):
    """The lean stage 6's host-only timeout (SIGALRM on the pool child's own thread)."""


@shared_task(name="bench.tasks.floor_execute_lean", ignore_result=True)
def floor_execute_lean(call_id: str, chain: str, channel: str) -> None:
    """S0's L: G with the leanest stage 6 that keeps its guarantees, to bound what Harness's
    worker could cost at best: the same compiled read (one statement: the call, its session,
    agent, owner's profile and the policy layers' revisions), context and guards before the
    claim; after it, the tool's body run on the pool child's own thread (no tool runner
    thread, no handoff) under a host-only timer (SIGALRM at the tool's timeout), and its
    content projected; then the floor's result and wake-up."""
    import dataclasses
    import signal
    import time

    from bench import floor
    from dispatcher import pipeline
    from dispatcher.execution import _execution_context

    call, ctx = _rechecked(call_id)
    floor.transition(call_id, chain, "queued", "running")

    def expired(signum: int, frame: object) -> None:
        raise _BodyTimedOut

    outcome = pipeline.Outcome()
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, ctx.tool.timeout + 1.0)
    try:
        execution_ctx = dataclasses.replace(
            _execution_context(call, ctx, None), deadline=time.monotonic() + ctx.tool.timeout
        )
        outcome.value = pipeline.default_execute_wrapper(
            ctx.tool, execution_ctx, call.arguments or {}
        )
    except _BodyTimedOut:
        outcome.timed_out = True
    except Exception as exc:  # noqa: BLE001 - every failure becomes an answer
        outcome.error = exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    pipeline.project_content(ctx.tool, outcome)
    floor.transition(call_id, chain, "running", "completed")
    _redis().publish(channel, f"{call_id} completed")
