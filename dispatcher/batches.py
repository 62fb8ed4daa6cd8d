"""Batch order: which queued calls of one assistant message may start now, and the
workers' messages for them (only the call id, sent after commit).
"""

from __future__ import annotations

import functools
import uuid

from celery import current_app
from django.db import transaction
from django.utils import timezone

from dispatcher.models import TERMINAL_STATUSES, Status, ToolCall
from dispatcher.tools.registry import get_tool
from floor import celery_message
from floor.compiled import Compiled
from floor.redis_clients import redis_at

EXECUTE_TASK = "dispatcher.tasks.execute_call"


def enqueue(call_id: str) -> None:
    """Send the worker's message for one call, by task name (no import of the tasks):
    pushed directly where floor.celery_message can (a plain Redis broker), else send_task."""
    target = celery_message.raw_target(EXECUTE_TASK)
    if target is None:
        current_app.send_task(EXECUTE_TASK, args=(call_id,))
    else:
        url, queue = target
        redis_at(url).lpush(queue, celery_message.task_message(EXECUTE_TASK, call_id, queue))


def enqueue_after_commit(call_id: str) -> None:
    # robust: a message the broker refuses is logged and left to the reconciler.
    transaction.on_commit(functools.partial(enqueue, call_id), robust=True)


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


# Read after every call a worker finishes (floor.compiled): the batch's unfinished
# calls, and of them only what `startable` and the sending need (a batch of 20 read whole,
# JSON columns and all, cost more than the finish it followed).
_UNFINISHED = Compiled(
    lambda batch_id: (
        ToolCall.objects.filter(batch_id=batch_id)
        .exclude(status__in=sorted(TERMINAL_STATUSES))
        .only("id", "name", "status", "enqueued_at", "batch_index")
        .order_by("batch_index")
    )
)


def dispatch_ready(batch_id: uuid.UUID) -> None:
    """Send a Celery message (only the call id) for each call of the batch that may start.

    Messages leave after commit, so a worker never receives the id of a call it cannot see
    yet. (Admission marks and sends a new message's runnable calls itself.)
    """
    calls = _UNFINISHED.all(uuid.UUID(str(batch_id)))
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
                enqueue_after_commit(str(call.pk))


def dispatch_decided(call: ToolCall) -> None:
    """`call` just left pending_approval (in the transaction that moved it): send what may
    start now. The only call of its batch starts if it was queued: its approval marked
    its message sent in the same update (`transitions.approve_call`), so only the message
    is left to send, and nothing is read."""
    if call.batch_size != 1:
        dispatch_ready(call.batch_id)
    elif call.status == Status.QUEUED:
        enqueue_after_commit(str(call.pk))


def all_sent(calls: list[ToolCall], sent: list[ToolCall]) -> bool:
    """Whether `sent` (the calls of a new batch whose messages leave at admission) is every
    call of the batch that is not finished: then no call of it ever waits for another."""
    sent_ids = {id(c) for c in sent}
    return all(id(c) in sent_ids or c.status in TERMINAL_STATUSES for c in calls)


def dispatch_after(call: ToolCall) -> None:
    """`call` just finished: send what may start next in its batch. Nothing is read when
    nothing can be next: a batch of one, or a batch whose every call was sent at admission
    (both recorded at admission)."""
    if call.batch_size != 1 and not call.batch_all_sent:
        dispatch_ready(call.batch_id)
