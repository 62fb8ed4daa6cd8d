"""This process's Redis clients, one connection pool per URL: the wake-ups' publisher and
the direct push of a call's Celery message share it."""

from __future__ import annotations

import functools

import redis


@functools.cache
def redis_at(url: str) -> redis.Redis:
    """This process's client of the Redis server at `url` (one pool per URL)."""
    return redis.Redis.from_url(url)
