"""Batch order: which queued calls of one assistant message may start now, and the
workers' messages for them (only the call id, sent after commit).
"""

from __future__ import annotations

import base64
import functools
import json
import os
import socket
import uuid
from typing import Any

from celery import current_app
from django.db import transaction
from django.utils import timezone

from dispatcher import notify
from dispatcher.compiled import Compiled
from dispatcher.models import TERMINAL_STATUSES, Status, ToolCall
from dispatcher.tools.registry import get_tool

EXECUTE_TASK = "dispatcher.tasks.execute_call"


def enqueue(call_id: str) -> None:
    """Send the worker's message for one call, by task name (no import of the tasks).

    On the Redis broker Harness runs on, the message is pushed the way kombu's Redis
    transport pushes it (one LPUSH of Celery's protocol-2 JSON envelope onto the queue's
    list): `send_task` cost 435 us of CPU per message in-process against 76 us, most of it
    kombu's producer machinery (docs/benchmarks.md). Any other broker, or a broker set up
    beyond a plain URL (TLS options, routes, custom queues, priorities), uses `send_task`.
    tests/dispatcher/test_enqueue.py holds the two messages side by side.
    """
    target = _raw_target()
    if target is None:
        current_app.send_task(EXECUTE_TASK, args=(call_id,))
    else:
        url, queue = target
        notify.redis_at(url).lpush(queue, task_message(call_id, queue))


def _raw_target() -> tuple[str, str] | None:
    """The broker's Redis URL (as redis-py reads it) and the queue's list name when the
    message can be pushed directly; None otherwise. Worked out once per broker URL (a
    test or an operator may point Celery at another broker; Celery's settings cost ~8 us
    a read)."""
    return _target_for(str(current_app.conf.broker_url or ""))


@functools.cache
def _target_for(url: str) -> tuple[str, str] | None:
    conf = current_app.conf
    configured = url
    if url.startswith("redis+socket://"):  # (the embedded Redis)
        url = "unix://" + url.removeprefix("redis+socket://")
    # Only a plain URL, which redis-py and kombu read alike: no TLS (`rediss://`: they
    # default and parse its certificate options differently), no options in a query
    # string, no failover list, no separate write broker.
    plain = (
        url.startswith(("redis://", "unix://"))
        and "?" not in url
        and ";" not in url
        and conf.broker_write_url in (None, "", configured)  # (Celery's default: the same)
        and set(conf.broker_transport_options or {}) <= {"visibility_timeout"}
        and not conf.broker_use_ssl
        and _execution_unrouted(conf.task_routes)
        and not conf.task_queues
        and conf.task_default_priority is None
        and not conf.task_send_sent_event
        and not conf.task_compression
        and conf.task_protocol == 2
        and conf.task_serializer == "json"
        and not conf.task_always_eager
    )
    return (url, str(conf.task_default_queue)) if plain else None


def _execution_unrouted(routes: Any) -> bool:
    """Whether no task route takes the worker's message off the default queue: the
    background lane's routes (settings.BACKGROUND_TASKS) name other tasks only, so the
    execution lane stays the default queue and the direct push stays right."""
    from celery.app.routes import MapRoute, prepare

    routers = prepare(routes)
    return all(isinstance(r, MapRoute) and r(EXECUTE_TASK) is None for r in routers)


_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def task_message(call_id: str, queue: str) -> str:
    """Celery's message for `execute_call(call_id)`, as send_task builds and kombu wraps it
    (inside a worker's task, with that task as its parent and its root, as send_task does)."""
    task_id = str(uuid.uuid4())
    root_id, parent_id = task_id, None
    current = current_app.current_worker_task
    if current is not None and current.request.id:
        root_id, parent_id = current.request.root_id or current.request.id, current.request.id
    body = json.dumps([[call_id], {}, _EMBED]).encode()
    return json.dumps(
        {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {
                "lang": "py",
                "task": EXECUTE_TASK,
                "id": task_id,
                "shadow": None,
                "eta": None,
                "expires": None,
                "group": None,
                "group_index": None,
                "retries": 0,
                "timelimit": [None, None],
                "root_id": root_id,
                "parent_id": parent_id,
                "argsrepr": repr((call_id,)),
                "kwargsrepr": "{}",
                "origin": _origin(),
                "ignore_result": None,
                "replaced_task_nesting": 0,
                "stamped_headers": None,
                "stamps": {},
            },
            "properties": {
                "correlation_id": task_id,
                "reply_to": _origin(),
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    )


def _origin() -> str:
    """Who sent it, as Celery names an anonymous sender: gen<pid>@<host>."""
    return f"gen{os.getpid()}@{socket.gethostname()}"


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


# Read after every call a worker finishes (dispatcher.compiled): the batch's unfinished
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
