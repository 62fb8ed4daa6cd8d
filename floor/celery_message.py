"""Celery's message for one task with one id, pushed onto the broker's Redis list directly.

On the Redis broker Harness runs on, a call's message is pushed the way kombu's Redis
transport pushes it (one LPUSH of Celery's protocol-2 JSON envelope onto the queue's list):
`send_task` costs several times the CPU per message, most of it kombu's producer machinery
(docs/benchmarks.md). Any other broker, or a broker set up beyond a plain URL (TLS
options, routes, custom queues, priorities), uses `send_task`: `raw_target` says which.
tests/dispatcher/test_enqueue.py holds the two messages side by side.

Verified against Celery 5.7 and kombu 5.7 (`VERIFIED_WITH`; dispatcher.W015 warns at
start-up when another line is installed).
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

VERIFIED_WITH = {"celery": "5.7", "kombu": "5.7"}


def raw_target(task: str) -> tuple[str, str] | None:
    """The broker's Redis URL (as redis-py reads it) and the queue's list name when the
    message can be pushed directly; None otherwise. Worked out once per broker URL (a
    test or an operator may point Celery at another broker; reading Celery's settings is
    not free on a hot path)."""
    return target_for(str(current_app.conf.broker_url or ""), task)


@functools.cache
def target_for(url: str, task: str) -> tuple[str, str] | None:
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
        and _unrouted(conf.task_routes, task)
        and not conf.task_queues
        and conf.task_default_priority is None
        and not conf.task_send_sent_event
        and not conf.task_compression
        and conf.task_protocol == 2
        and conf.task_serializer == "json"
        and not conf.task_always_eager
    )
    return (url, str(conf.task_default_queue)) if plain else None


def _unrouted(routes: Any, task: str) -> bool:
    """Whether no task route takes `task`'s message off the default queue: the background
    lane's routes (settings.BACKGROUND_TASKS) name other tasks only, so the execution lane
    stays the default queue and the direct push stays right."""
    from celery.app.routes import MapRoute, prepare

    routers = prepare(routes)
    return all(isinstance(r, MapRoute) and r(task) is None for r in routers)


_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def task_message(task: str, call_id: str, queue: str, *more: str) -> str:
    """Celery's message for `task(call_id, *more)`, as send_task builds and kombu wraps it
    (inside a worker's task, with that task as its parent and its root, as send_task does)."""
    task_id = str(uuid.uuid4())
    root_id, parent_id = task_id, None
    current = current_app.current_worker_task
    if current is not None and current.request.id:
        root_id, parent_id = current.request.root_id or current.request.id, current.request.id
    return _envelope(task, (call_id, *more), queue, task_id, root_id, parent_id, str(uuid.uuid4()))


# A message a Redis script may push, built once per process (`task_message_template`):
# cut into its fixed parts where the ids that differ from one message to the next go, and
# each gap's kind, for the script to join the parts with its own ids (`ID`: the task id
# and the correlation id; `TAG`: the delivery tag) and the JSON of the sending task's root
# and parent ids (`lineage`). Cut where the ids were put, not where a word stands: the
# queue's name, or anything else in the message, can hold any text and is kept as it is.
ID, TAG, ROOT, PARENT = "I", "T", "R", "P"


def task_message_template(task: str, call_id: str, queue: str) -> tuple[str, tuple[str, ...]]:
    """`task_message`'s message for `task(call_id)` as its gaps' kinds (a string, one letter
    of ID, TAG, ROOT, PARENT a gap) and its parts (one more than its gaps), a gap where
    each JSON value that differs from one message to the next goes: built once per process
    (its origin names the process), for a message sent only now and then but offered on
    every call (batches.end_turn's owed turn)."""
    return _template(task, call_id, queue, os.getpid())


@functools.cache
def _template(task: str, call_id: str, queue: str, pid: int) -> tuple[str, tuple[str, ...]]:
    while True:
        # Stand-ins no other text of the message holds (a name may hold anything: one that
        # held a stand-in too, by chance or on purpose, gets another).
        stand_in = {kind: uuid.uuid4().hex for kind in (ID, TAG, ROOT, PARENT)}
        envelope = _envelope(
            task, (call_id,), queue, stand_in[ID], stand_in[ROOT], stand_in[PARENT], stand_in[TAG]
        )
        found = sorted(
            (at, kind)
            for kind, text in stand_in.items()
            for at in _occurrences(envelope, json.dumps(text))
        )
        if [kind for _, kind in found].count(ID) == 2 and len(found) == 5:
            break
    kinds, parts, start = "", [], 0
    for at, kind in found:
        kinds += kind
        parts.append(envelope[start:at])
        start = at + len(json.dumps(stand_in[kind]))
    parts.append(envelope[start:])
    return kinds, tuple(parts)


def _occurrences(text: str, part: str) -> list[int]:
    found, at = [], text.find(part)
    while at >= 0:
        found.append(at)
        at = text.find(part, at + 1)
    return found


def lineage() -> tuple[str, str]:
    """The JSON of the root and parent ids `task_message` would give a message sent now,
    for a template's ROOT and PARENT gaps: inside a worker's task, that task's; else none
    for the parent and, for the root, an empty string (the message's own id goes there)."""
    current = current_app.current_worker_task
    if current is not None and current.request.id:
        root = current.request.root_id or current.request.id
        return json.dumps(root), json.dumps(current.request.id)
    return "", "null"


def _envelope(
    task: str,
    args: tuple[str, ...],
    queue: str,
    task_id: str,
    root_id: str,
    parent_id: str | None,
    delivery_tag: str,
) -> str:
    body = json.dumps([list(args), {}, _EMBED]).encode()
    return json.dumps(
        {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": {
                "lang": "py",
                "task": task,
                "id": task_id,
                "shadow": None,
                "eta": None,
                "expires": None,
                "group": None,
                "group_index": None,
                "retries": 0,
                "timelimit": _time_limits(task),
                "root_id": root_id,
                "parent_id": parent_id,
                "argsrepr": repr(args),
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
                "delivery_tag": delivery_tag,
            },
        }
    )


def _time_limits(task: str) -> list[float | None]:
    """The limits send_task puts in the header: the registered task's own (Celery 5.7 merges
    a registered task's execution options), none when this process has not registered it."""
    registered = current_app.tasks.get(task)
    if registered is None:
        return [None, None]
    return [registered.time_limit, registered.soft_time_limit]


def _origin() -> str:
    """Who sent it, as Celery names an anonymous sender: gen<pid>@<host>."""
    return f"gen{os.getpid()}@{socket.gethostname()}"
