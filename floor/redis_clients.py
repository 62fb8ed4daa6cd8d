"""This process's Redis clients, one connection pool per URL: the wake-ups' publisher and
the direct push of a call's Celery message share it. And `one_round_trip`: the commands
a thread sends meanwhile that may go later and together (a wake-up, a wait slot given
back) sent in one round trip when it ends. And `Script`: a Lua script run by its digest,
its command packed here (the caps' and the turns' scripts).

`Script` leans on redis-py's connection internals (`send_packed_command`,
`read_response`, the connection's `retry`): verified against redis-py 8.2
(`VERIFIED_WITH`; dispatcher.W015 warns at start-up when it differs)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import redis

logger = logging.getLogger(__name__)

VERIFIED_WITH = {"redis": "8.2"}


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
        self.commands: list[tuple[tuple[str | bytes, ...], str]] = []

    def add(self, command: tuple[str | bytes, ...], what: str) -> None:
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


def _part(value: str | bytes | float) -> bytes:
    """One argument of a command, as redis-py's encoder sends it (a number by its repr;
    a bool, or any other type, refused with redis-py's DataError)."""
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, bool) or not isinstance(value, str | int | float):
        raise redis.DataError(f"Invalid input of type: '{type(value).__name__}'.")
    else:
        data = (value if isinstance(value, str) else repr(value)).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


class Script:
    """A Lua script run by its digest (EVALSHA) with the command packed here, on a
    connection of the given client's pool: a third less of redis-py's Python per call
    than `eval` or a registered Script (docs/benchmarks.md, "The caps' Redis scripts"),
    with redis-py's own retries, timeouts and reconnection, and its errors (a script's
    error reply raises redis.ResponseError, as redis-py's own call does). A server that
    does not know the script yet (restarted, flushed) is sent its text once (EVAL, which
    keeps it)."""

    def __init__(self, text: str) -> None:
        self.text = _part(text)
        self.sha = _part(hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest())

    def run(
        self, client: redis.Redis, keys: Sequence[str], args: Sequence[str | bytes | float]
    ) -> Any:
        """The script's reply on the server of `client` (raises what redis-py raises)."""
        parts = [_part(len(keys)), *map(_part, keys), *map(_part, args)]
        head = b"*%d\r\n" % (len(parts) + 2)
        pool = client.connection_pool
        connection: Any = pool.get_connection()
        try:
            return connection.retry.call_with_retry(
                lambda: self._send(connection, head, parts),
                lambda error: connection.disconnect(),
            )
        finally:
            pool.release(connection)

    def _send(self, connection: Any, head: bytes, parts: list[bytes]) -> Any:
        connection.send_packed_command([b"".join([head, b"$7\r\nEVALSHA\r\n", self.sha, *parts])])
        try:
            return connection.read_response()
        except redis.exceptions.NoScriptError:
            connection.send_packed_command([b"".join([head, b"$4\r\nEVAL\r\n", self.text, *parts])])
            return connection.read_response()
