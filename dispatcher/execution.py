"""Stages 6 to 10 in the worker: claim, re-check, execute, project, post-execute, finalize, result.

Plus batch ordering (which queued calls may start) and the reconciler that ends lost
leases as outcome_unknown and re-sends lost messages.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from . import messages, pipeline
from .context import Decision
from .models import TERMINAL_STATUSES, Status, ToolCall
from .registry import get_tool
from .services import call_context, mode_and_profile, transition
from .tools.base import ExecutionContext, Tool

logger = logging.getLogger(__name__)


# --- Batch order -----------------------------------------------------------------------


def startable(calls: list[ToolCall]) -> list[ToolCall]:
    """Queued calls that may start now: the first unfinished call, and with it, when it is
    concurrency-safe, the unbroken run of concurrency-safe calls that follows it."""
    unfinished = [c for c in calls if c.status not in TERMINAL_STATUSES]
    if not unfinished:
        return []
    group: list[ToolCall] = []
    for call in unfinished:
        tool = get_tool(call.name)
        safe = bool(tool and tool.is_concurrency_safe)
        if not group:
            group.append(call)
            if not safe:
                break
        elif safe:
            group.append(call)
        else:
            break
    return [c for c in group if c.status == Status.QUEUED]


def dispatch_ready(batch_id: uuid.UUID) -> None:
    """Send a Celery message (only the call id) for each call of the batch that may start.

    Messages leave after commit, so a worker never receives the id of a call it cannot see
    yet. (Admission marks and sends a new message's runnable calls itself.)
    """
    from .tasks import execute_call

    calls = list(ToolCall.objects.filter(batch_id=batch_id).order_by("batch_index"))
    # Only calls no message was sent for: the rows were just read, and the conditional
    # update below still settles a race between two dispatchers.
    ready = [c for c in startable(calls) if c.enqueued_at is None]
    if not ready:
        return
    with transaction.atomic(savepoint=False):
        for call in ready:
            # Conditional: a call is sent once, even when two processes dispatch the batch.
            if ToolCall.objects.filter(
                pk=call.pk, status=Status.QUEUED, enqueued_at__isnull=True
            ).update(enqueued_at=timezone.now()):
                call_id = str(call.pk)
                # robust: a message the broker refuses is left to the reconciler.
                send = functools.partial(execute_call.delay, call_id)
                transaction.on_commit(send, robust=True)


# --- Stage 6 to 10 -----------------------------------------------------------------------


def execute_call(call_id: str) -> None:
    """Stages 6 to 10 for one queued call. Idempotent: a second delivery does nothing."""
    call = (
        ToolCall.objects.select_related("session__agent__owner__permission_profile")
        .filter(pk=call_id)
        .first()
    )
    if call is None or call.status != Status.QUEUED:
        return
    session = call.session
    ctx = call_context(call, session, *mode_and_profile(session, preloaded=True))
    if ctx is None:
        return _deny_before_run(call, ["The tool is no longer registered."], "registry")
    denials = pipeline.guards(ctx)  # re-run: time has passed since admission
    if denials:
        return _deny_before_run(call, [r for _, r in denials], ",".join(n for n, _ in denials))
    tool = ctx.tool
    if not _claim(call, tool):
        return None
    started = time.monotonic()
    exec_ctx = ExecutionContext(
        workspace=Path(session.workspace),
        call_id=str(call.pk),
        timeout=tool.timeout,
        output_limit=settings.HARNESS_OUTPUT_LIMIT,
    )
    outcome = pipeline.execute(tool, exec_ctx, call.arguments or {})
    if outcome.timed_out:
        status, content, is_error = (
            Status.TIMED_OUT,
            messages.timed_out(tool.name, tool.timeout),
            True,
        )
    else:
        content, is_error = pipeline.project_content(tool, outcome)
        if not is_error:
            content = pipeline.post_execute(ctx, content)
        status = Status.COMPLETED
    content = pipeline.finalize_content(
        tool, content, repeat_count=call.repeat_count, raw_arguments=call.raw_arguments
    )
    result(call, status, content, is_error, time.monotonic() - started)
    return None


def _deny_before_run(call: ToolCall, reasons: list[str], guards: str) -> None:
    decision = Decision("deny", f"guard:{guards}", " ".join(reasons))
    content = messages.guard_denied(reasons) + messages.repeat_reminder(
        call.repeat_count, call.name, call.raw_arguments
    )
    with transaction.atomic():
        transition(
            call,
            Status.DENIED,
            kind="call.denied",
            actor=decision.by,
            payload={**decision.as_provenance(), "stage": "execute"},
            decision="deny",
            decided_by=decision.by,
            reason=decision.reason,
            provenance={**call.provenance, "recheck": decision.as_provenance()},
            content=content,
            is_error=True,
        )
    dispatch_ready(call.batch_id)


def _claim(call: ToolCall, tool: Tool) -> bool:
    """The one conditional update that lets exactly one worker run the call."""
    now = timezone.now()
    with transaction.atomic():
        return transition(
            call,
            Status.RUNNING,
            kind="call.started",
            actor="worker",
            payload={"attempt": call.attempts + 1, "timeout": tool.timeout},
            started_at=now,
            attempts=call.attempts + 1,
            lease_until=now + timedelta(seconds=tool.timeout + settings.HARNESS_LEASE_GRACE),
        )


def result(call: ToolCall, status: Status, content: str, is_error: bool, seconds: float) -> None:
    """Stage 10: freeze the result, audit it, deliver it (wake-up after commit), start what is next."""
    kind = "call.completed" if status == Status.COMPLETED else "call.timed_out"
    with transaction.atomic():
        transition(
            call,
            status,
            kind=kind,
            actor="worker",
            payload={"is_error": is_error, "content": content, "seconds": round(seconds, 4)},
            content=content,
            is_error=is_error,
            timings={**call.timings, "execute_s": round(seconds, 4)},
        )
    dispatch_ready(call.batch_id)


# --- Reconciler --------------------------------------------------------------------------


def reconcile() -> dict[str, int]:
    """End expired leases as outcome_unknown; re-send messages for queued calls that were lost.

    Safe to run anywhere at any time: every change is a conditional update.
    """
    now = timezone.now()
    unknown = 0
    for call in ToolCall.objects.lease_expired(now):
        with transaction.atomic():
            unknown += transition(
                call,
                Status.OUTCOME_UNKNOWN,
                kind="call.outcome_unknown",
                actor="reconciler",
                payload={"lease_until": call.lease_until.isoformat() if call.lease_until else None},
                content=messages.outcome_unknown(),
                is_error=True,
                reason="The worker's lease expired before it reported a result.",
            )
        dispatch_ready(call.batch_id)
    stale = now - timedelta(seconds=settings.HARNESS_REQUEUE_AFTER)
    resent = 0
    batches = set(
        ToolCall.objects.filter(status=Status.QUEUED, queued_at__lt=stale)
        .exclude(enqueued_at__gt=stale)
        .values_list("batch_id", flat=True)
    )
    for batch_id in batches:
        resent += ToolCall.objects.filter(
            batch_id=batch_id, status=Status.QUEUED, enqueued_at__lt=stale
        ).update(enqueued_at=None)
        dispatch_ready(batch_id)
    return {"outcome_unknown": unknown, "resent": resent}
