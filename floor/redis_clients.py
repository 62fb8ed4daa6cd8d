"""This process's Redis clients, one connection pool per URL: the wake-ups' publisher and
the direct push of a call's Celery message share it."""

from __future__ import annotations

import functools

import redis


@functools.cache
def redis_at(url: str) -> redis.Redis:
    """This process's client of the Redis server at `url` (one pool per URL). A server
    that stops answering fails a command within seconds (its callers log it and go on:
    a lost wake-up delays an answer, a lost message is sent again by the reconciler),
    never holding the thread that sent it."""
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
