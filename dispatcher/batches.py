"""Batch order: which queued calls of one assistant message may start now, and the
workers' messages for them (only the call id, sent after commit).
"""

from __future__ import annotations

import functools
import logging
import uuid
from typing import Any

import redis
from celery import current_app
from django.db import transaction
from django.utils import timezone

from dispatcher.models import TERMINAL_STATUSES, AgentSession, Status, ToolCall
from dispatcher.tools.registry import get_tool
from floor import celery_message
from floor.compiled import Compiled
from floor.redis_clients import redis_at

EXECUTE_TASK = "dispatcher.tasks.execute_call"

logger = logging.getLogger(__name__)


# The execution lane is shared by every agent, and Celery serves its queue in order: one
# agent's thousands of queued calls (64 a message, 20 messages a second) held another
# agent's read behind all of them (13 s behind 1,280 listings on 4 worker processes).
# So the queue's messages are turns, not calls: each push adds the call to its agent's
# list in Redis and one message; a worker taking a message runs the next call of the next
# agent in the ring (`_TAKE`), and an agent goes back to the ring's end while it has calls
# left. An agent then waits for at most one call of each other agent with calls queued,
# after the calls already running. Within one agent, its calls keep their order.
_PUSH = """
if redis.call('RPUSH', KEYS[2], ARGV[1]) == 1 then
  redis.call('RPUSH', KEYS[1], ARGV[2])
end
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('EXPIRE', KEYS[2], 86400)
redis.call('EXPIRE', KEYS[4], 86400)
redis.call('LPUSH', KEYS[3], ARGV[3])
"""
# The reconciler's re-send of a call queued too long: its message was lost (a worker
# killed holding it, Redis restarted) or is only late. A call still in its agent's list
# (the set beside it says so without reading the list: a flood's lists are long) gets
# one more message and no second place (a list with more calls than messages would leave
# its last call waiting for the reconciler after every burst, for good); a call the list
# lost gets both. An agent whose list outlived its place in the ring (the ring's key
# deleted or evicted alone) is put back: it joins the ring only when its list was empty,
# so its calls were otherwise never taken again and its list grew for good (LPOS reads
# the ring, one entry per agent with calls waiting, only on the reconciler's re-send).
_RESEND = """
if redis.call('SISMEMBER', KEYS[4], ARGV[1]) == 0 then
  if redis.call('RPUSH', KEYS[2], ARGV[1]) == 1 then
    redis.call('RPUSH', KEYS[1], ARGV[2])
  end
  redis.call('SADD', KEYS[4], ARGV[1])
  redis.call('EXPIRE', KEYS[2], 86400)
  redis.call('EXPIRE', KEYS[4], 86400)
elseif not redis.call('LPOS', KEYS[1], ARGV[2]) then
  redis.call('RPUSH', KEYS[1], ARGV[2])
end
redis.call('LPUSH', KEYS[3], ARGV[3])
"""
_TAKE = """
local agent = redis.call('LPOP', KEYS[1])
if not agent then return false end
local calls = ARGV[1] .. agent
local call = redis.call('LPOP', calls)
if call then redis.call('SREM', calls .. ':in', call) end
if redis.call('LLEN', calls) > 0 then redis.call('RPUSH', KEYS[1], agent) end
return call
"""


def _fair_keys(queue: str) -> tuple[str, str]:
    """The ring of agents with calls waiting, and the prefix of each agent's list (and of
    the set of the calls in it: `<list>:in`)."""
    return f"{queue}:fair:ring", f"{queue}:fair:agent:"


def enqueue(call_id: str, agent: str = "", *, resend: bool = False) -> None:
    """Send the worker's message for one call, by task name (no import of the tasks):
    pushed directly where floor.celery_message can (a plain Redis broker), with the call in
    its agent's turn (above), else send_task (served in order). `resend`: the reconciler's
    (`_RESEND`)."""
    target = celery_message.raw_target(EXECUTE_TASK)
    if target is None:
        current_app.send_task(EXECUTE_TASK, args=(call_id,))
        return
    url, queue = target
    message = celery_message.task_message(EXECUTE_TASK, call_id, queue)
    if not agent:
        redis_at(url).lpush(queue, message)
        return
    ring, prefix = _fair_keys(queue)
    script = _script(url, _RESEND if resend else _PUSH)
    calls = prefix + agent
    script(keys=[ring, calls, queue, calls + ":in"], args=[call_id, agent, message])


def next_turn(call_id: str) -> str:
    """In a worker, for the message of `call_id`: the call to run now, the next agent's in
    the ring. The message's own call when the ring is empty (a message pushed without an
    agent, or the ring lost with Redis): a call run twice is claimed once."""
    target = celery_message.raw_target(EXECUTE_TASK)
    if target is None:
        return call_id
    url, queue = target
    ring, prefix = _fair_keys(queue)
    try:
        turn = _script(url, _TAKE)(keys=[ring], args=[prefix])
    except redis.RedisError:
        logger.warning("could not take the next turn; running the message's call", exc_info=True)
        return call_id
    return turn.decode() if turn else call_id


@functools.cache
def _script(url: str, text: str) -> Any:
    return redis_at(url).register_script(text)  # sent by its digest (EVALSHA)


def agent_of(call: ToolCall) -> str:
    """The id of the agent whose turn `call` waits in: from the session loaded with the
    call (admission, the worker), else read."""
    if ToolCall.session.is_cached(call):
        return str(call.session.agent_id)
    return str(AgentSession.objects.values_list("agent_id", flat=True).get(pk=call.session_id))


def enqueue_after_commit(call_id: str, agent: str, *, resend: bool = False) -> None:
    # robust: a message the broker refuses is logged and left to the reconciler.
    transaction.on_commit(functools.partial(enqueue, call_id, agent, resend=resend), robust=True)


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


def dispatch_ready(batch_id: uuid.UUID, agent: str = "") -> None:
    """Send a Celery message (only the call id) for each call of the batch that may start,
    in the turn of `agent` (the batch's). Without `agent`, the reconciler's re-send: the
    agent is read and each call is re-sent (`_RESEND`).

    Messages leave after commit, so a worker never receives the id of a call it cannot see
    yet. (Admission marks and sends a new message's runnable calls itself.)
    """
    calls = _UNFINISHED.all(uuid.UUID(str(batch_id)))
    # Only calls no message was sent for: the rows were just read, and the conditional
    # update below still settles a race between two dispatchers.
    ready = [c for c in startable(calls) if c.enqueued_at is None]
    if not ready:
        return
    resend = not agent
    if resend:
        agent = str(
            ToolCall.objects.filter(pk=ready[0].pk)
            .values_list("session__agent_id", flat=True)
            .get()
        )
    with transaction.atomic(savepoint=False):
        for call in ready:
            # Conditional: a call is sent once, even when two processes dispatch the batch.
            if ToolCall.objects.filter(
                pk=call.pk, status=Status.QUEUED, enqueued_at__isnull=True
            ).update(enqueued_at=timezone.now()):
                enqueue_after_commit(str(call.pk), agent, resend=resend)


def dispatch_decided(call: ToolCall) -> None:
    """`call` just left pending_approval (in the transaction that moved it): send what may
    start now. The only call of its batch starts if it was queued: its approval marked
    its message sent in the same update (`transitions.approve_call`), so only the message
    is left to send, and nothing is read."""
    if call.batch_size != 1:
        dispatch_ready(call.batch_id, agent_of(call))
    elif call.status == Status.QUEUED:
        enqueue_after_commit(str(call.pk), agent_of(call))


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
        dispatch_ready(call.batch_id, agent_of(call))
