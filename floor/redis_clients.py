"""This process's Redis clients, one connection pool per URL: the wake-ups' publisher and
the direct push of a call's Celery message share it. And `one_round_trip`: the commands
a thread sends meanwhile that may go later and together (a wake-up, a wait slot given
back) sent in one round trip when it ends."""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Iterator

import redis

logger = logging.getLogger(__name__)


@functools.cache
def redis_at(url: str) -> redis.Redis:
    """This process's client of the Redis server at `url` (one pool per URL). A server
    that stops answering fails a command within seconds (its callers log it and go on:
    a lost wake-up delays an answer, a lost message is sent again by the reconciler),
    never holding the thread that sent it."""
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


class RoundTrip:
    """Commands to the Redis server at `url` kept by `one_round_trip`, each with what it
    is (for the warning when it is lost)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.commands: list[tuple[tuple[str, ...], str]] = []

    def add(self, command: tuple[str, ...], what: str) -> None:
        self.commands.append((command, what))

    def send(self) -> None:
        """Every command kept, in one round trip (one alone as itself). Never raises: a
        command that fails is logged, as its sender would have logged it."""
        commands, self.commands = self.commands, []
        if not commands:
            return
        client = redis_at(self.url)
        try:
            if len(commands) == 1:
                command = commands[0][0]
                replies: list[object] = [client.execute_command(*command)]  # type: ignore[no-untyped-call]
            else:
                pipe = client.pipeline(transaction=False)
                for command, _ in commands:
                    pipe.execute_command(*command)  # type: ignore[no-untyped-call]
                replies = pipe.execute(raise_on_error=False)
        except Exception:  # (as each sender's own: a lost wake-up, a slot that lapses)
            lost = ", ".join(what for _, what in commands)
            logger.warning("could not send to Redis: %s", lost, exc_info=True)
            return
        for (_, what), reply in zip(commands, replies, strict=True):
            if isinstance(reply, Exception):
                logger.warning("could not send to Redis: %s (%s)", what, reply)


_trips = threading.local()


def held(url: str) -> RoundTrip | None:
    """The round trip this thread is keeping commands to `url` for, if any."""
    trip: RoundTrip | None = getattr(_trips, "trip", None)
    return trip if trip is not None and trip.url == url else None


@contextlib.contextmanager
def one_round_trip(url: str) -> Iterator[RoundTrip]:
    """Within it, the commands to `url` this thread's senders may keep (`held`: the
    wake-ups, the wait slots given back) are kept, and sent together when it ends, even
    when it ends by an exception: one round trip instead of one each. For commands whose
    moment within the block does not matter, only that they are sent before it ends."""
    trip = RoundTrip(url)
    outer, _trips.trip = getattr(_trips, "trip", None), trip
    try:
        yield trip
    finally:
        _trips.trip = outer
        trip.send()
