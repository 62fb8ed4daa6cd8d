"""Pushes after commit: wake long-polling agent requests, and tell other apps a call changed.

Nothing here runs inside a transaction; callers schedule it with transaction.on_commit.
"""

from __future__ import annotations

import functools
import logging

import redis
from django.conf import settings
from django.dispatch import Signal

logger = logging.getLogger(__name__)

# Sent after commit whenever a call changes state: kwargs call_id, session_id, status,
# previous (the status it left).
call_changed = Signal()
# Sent inside the transaction that puts a call in pending_approval, so the approvals app
# records its request atomically with the transition: kwargs call, presentation.
approval_requested = Signal()


def wake_channel(call_id: str) -> str:
    return f"{settings.HARNESS_WAKE_PREFIX}:{call_id}"


def session_channel(session_id: str) -> str:
    """Where every change of a session's calls is announced (live audit timelines)."""
    return f"{settings.HARNESS_WAKE_PREFIX}:session:{session_id}"


@functools.cache
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def publish_change(call_id: str, session_id: str, status: str, previous: str = "") -> None:
    try:
        with _redis(settings.REDIS_URL).pipeline(transaction=False) as pipe:
            pipe.publish(wake_channel(call_id), status)
            pipe.publish(session_channel(session_id), call_id)
            pipe.execute()
    except redis.RedisError:
        # Waiting requests also re-read the database when their wait ends; a lost wake-up
        # delays an answer, it never changes one.
        logger.warning("could not publish wake-up for call %s", call_id, exc_info=True)
    call_changed.send(
        sender=None, call_id=call_id, session_id=session_id, status=status, previous=previous
    )
