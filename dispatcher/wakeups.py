"""Wake-ups after commit: wake long-polling agent requests when a call of their session
changes (and tell other apps, through dispatcher.signals.call_changed).

Publishing runs after commit (callers schedule it with transaction.on_commit): one
message per change, on its session's channel, saying which call and its new status.
Waiting requests of one process share one Redis subscription (`wake_on`): one connection
per event loop, whatever the number of waits, with a reader that fans each wake-up out
to the requests waiting on its channel. A channel stays subscribed for
HARNESS_WAKE_LINGER seconds
after its last waiter, so the next wait of the same session joins it at once
(`join_subscribed`, no round trip to Redis). How many requests of one agent may wait at
once is dispatcher.limits's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import weakref
from collections.abc import AsyncIterator, Iterable

import redis
import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from dispatcher.signals import call_changed
from floor.redis_clients import held, redis_at

logger = logging.getLogger(__name__)

# How long a waiter waits for Redis to confirm its subscription before giving up.
SUBSCRIBE_TIMEOUT = 5.0
# How long a hub keeps its connection once nobody waits: an agent making one call after
# another would otherwise open a new Redis connection for every wait, and redis-py's
# connection set-up was a large share of daphne's CPU per call (docs/benchmarks.md).
IDLE_CLOSE_AFTER = 30.0
# At most this many channels linger per hub (the oldest is unsubscribed first): every
# message on a lingering channel still reaches the hub's reader.
MAX_LINGERING = 1000


def session_channel(session_id: str) -> str:
    """Where every change of a session's calls is announced: waiting agent requests, MCP
    gateway calls and live audit timelines listen here. Each message is "<call id> <status>"
    (`parse_news`)."""
    return f"{settings.HARNESS_WAKE_PREFIX}:session:{session_id}"


def parse_news(news: str) -> tuple[str, str]:
    """A wake-up's (call id, new status); ("", "") when it says neither."""
    call_id, _, status = news.partition(" ")
    return (call_id, status) if status else ("", "")


def needs_read(news: set[str], watched: set[str], quiet: frozenset[str] = frozenset()) -> bool:
    """Whether a wake-up's messages (`Wakeup.take_news`) can have changed what a waiter
    on the calls `watched` answers: one says a watched call moved to a status outside
    `quiet`, or one says nothing readable (so does a wake-up with no message)."""
    if not news:
        return True
    for item in news:
        call_id, status = parse_news(item)
        if not call_id or (call_id in watched and status not in quiet):
            return True
    return False


def publish_change(call_id: str, session_id: str, status: str, previous: str = "") -> None:
    """The change announced on its session's channel (kept for the thread's round trip to
    Redis when one is open: redis_clients.one_round_trip), and to the other apps."""
    channel, message = session_channel(session_id), f"{call_id} {status}"
    trip = held(settings.REDIS_URL)
    try:
        if trip is not None:
            trip.add(("PUBLISH", channel, message), f"the wake-up for call {call_id}")
        else:
            redis_at(settings.REDIS_URL).publish(channel, message)
    except Exception:
        # Waiting requests also re-read the database when their wait ends; a lost wake-up
        # delays an answer, it never changes one. Any failure of the client, not only a
        # RedisError: under load redis-py's connect has raised ValueError ("I/O operation
        # on closed file") from this after-commit hook, which turned an admitted call's
        # request into a 500.
        logger.warning("could not publish wake-up for call %s", call_id, exc_info=True)
    call_changed.send(
        sender=None, call_id=call_id, session_id=session_id, status=status, previous=previous
    )


# --- Waiting ------------------------------------------------------------------------------


class WakeUnavailable(Exception):
    """The wake-up channel (Redis) failed; the waiter should answer with what it has."""


class Wakeup:
    """One waiting request: set when a message arrives on one of its channels."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.error: BaseException | None = None
        self._news: set[str] = set()

    def wake(self, error: BaseException | None = None, news: str | None = None) -> None:
        if error is not None:
            self.error = error
        if news is not None:
            self._news.add(news)
        self._event.set()

    def take_news(self) -> set[str]:
        """What the messages since the last call said ("<call id> <status>" each,
        `parse_news`); empty when a wake-up said nothing."""
        news, self._news = self._news, set()
        return news

    async def wait(self, timeout: float) -> bool:
        """True when woken within `timeout` seconds. Raises WakeUnavailable when the
        shared subscription broke (the caller answers with the state it has)."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return False
        finally:
            if self.error is not None:
                raise WakeUnavailable(str(self.error)) from self.error
        self._event.clear()
        return True


@contextlib.asynccontextmanager
async def wake_on(channels: Iterable[str]) -> AsyncIterator[Wakeup]:
    """Subscribe to `channels` on this process's shared subscription for the duration.

    Returns once Redis confirmed the subscription (so a change published after that is
    never missed: re-read the state then). Raises WakeUnavailable when Redis fails.
    """
    names = sorted(set(channels))
    wakeup = Wakeup()
    while True:
        hub = _hub()
        if await hub.add(wakeup, names):
            break  # else the hub closed as we joined: join the next one
    try:
        yield wakeup
    finally:
        await hub.remove(wakeup, names)


class Joined:
    """A wait registered on an already subscribed channel (`join_subscribed`); `leave()`
    when done, in every case."""

    def __init__(self, hub: _Hub, wakeup: Wakeup, channel: str, expires: float | None) -> None:
        self.hub, self.wakeup, self.channel = hub, wakeup, channel
        self.expires = expires  # when the channel stopped lingering for this join (or None)

    @property
    def usable(self) -> bool:
        """Still listening: its hub has not failed or closed since the join."""
        return not self.hub.closed and self.wakeup.error is None

    async def leave(self, *, served: bool = True) -> None:
        """Leave the channel. `served`: the request was authenticated and answered; when
        it was not (401, 404, 429, a malformed body), the channel lingers only as long as
        it would have without this request."""
        await self.hub.remove(
            self.wakeup, [self.channel], linger_until=None if served else self.expires
        )


def join_subscribed(channel: str) -> Joined | None:
    """Wait on `channel` from now on if this process's subscription already has it
    confirmed (another wait, or one that just ended: HARNESS_WAKE_LINGER): no round trip
    to Redis, so a request can join before it knows whether it will wait, ahead of
    anything it writes. None when the channel is not subscribed (then `wake_on`, after
    authenticating).

    Never subscribes anything: a request that has not proved who it is yet costs Redis
    nothing, and only `wake_on` (called after authentication) makes channels linger."""
    hub = _hubs.get(asyncio.get_running_loop())
    if hub is None:
        return None
    wakeup = Wakeup()
    joined, expires = hub.join(wakeup, channel)
    return Joined(hub, wakeup, channel, expires) if joined else None


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Hub] = weakref.WeakKeyDictionary()


def _hub() -> _Hub:
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = _Hub(loop)
    return hub


def open_subscriptions() -> int:
    """Shared subscriptions open in this process (one per event loop with waiters)."""
    return sum(1 for hub in _hubs.values() if hub.waiters)


class _Hub:
    """One pub/sub connection and its reader, for every waiter of one event loop.

    Channels are reference-counted: the first waiter on a channel subscribes; after the
    last one leaves, the channel lingers (stays subscribed) for HARNESS_WAKE_LINGER
    seconds, then is unsubscribed. The connection closes when nobody has waited for IDLE_CLOSE_AFTER
    seconds, or when its event loop ends (the next waiter opens a new one). A Redis
    failure wakes every waiter with the error and retires the hub.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.client = aioredis.Redis.from_url(
            settings.REDIS_URL,
            client_name=f"harness-wake-{os.getpid()}",
            retry=Retry(NoBackoff(), 0),  # a broken connection fails its waiters at once
            socket_connect_timeout=SUBSCRIBE_TIMEOUT,
        )
        self.pubsub = self.client.pubsub()
        self.waiters: dict[str, set[Wakeup]] = {}
        self.confirmed: dict[str, asyncio.Future[None]] = {}
        self.lock = asyncio.Lock()
        self.reader: asyncio.Task[None] | None = None
        self.closed = False
        self.failure: BaseException | None = None  # why it was retired, when Redis failed
        self.idle: asyncio.TimerHandle | None = None
        # Subscribed and confirmed channels nobody waits on: channel -> when it expires.
        self.lingering: dict[str, float] = {}
        self.sweep: asyncio.TimerHandle | None = None

    def join(self, wakeup: Wakeup, channel: str) -> tuple[bool, float | None]:
        """Register `wakeup` on `channel` if it is subscribed and confirmed (waited on or
        lingering): (True, when its linger would have ended, if it lingered); (False, None)
        otherwise (nothing registered). Touches no timer: a join is not yet a wait."""
        if self.closed or channel in self.confirmed:
            return False, None
        if channel not in self.waiters and channel not in self.lingering:
            return False, None
        expires = self.lingering.pop(channel, None)
        self.waiters.setdefault(channel, set()).add(wakeup)
        return True, expires

    async def add(self, wakeup: Wakeup, channels: list[str]) -> bool:
        """Register `wakeup` on `channels`, subscribing the new ones; False if this hub has
        closed meanwhile. Returns when every channel's subscription is confirmed; raises
        WakeUnavailable when Redis does not answer within SUBSCRIBE_TIMEOUT (the hub is
        retired then: a Redis that accepts connections and answers nothing must not hold
        waits past their deadlines, nor the next ones)."""
        try:
            async with asyncio.timeout(SUBSCRIBE_TIMEOUT):
                pending = await self._register(wakeup, channels)
        except TimeoutError as error:
            self._fail(WakeUnavailable("Redis did not answer the subscription in time"))
            raise WakeUnavailable("Redis did not answer the subscription in time") from error
        if pending is None:
            return False
        return await self._confirmed(wakeup, channels, pending)

    async def _register(
        self, wakeup: Wakeup, channels: list[str]
    ) -> list[asyncio.Future[None]] | None:
        """(`add`'s first half, under the lock.) The confirmations to wait for; None when
        the hub has closed."""
        async with self.lock:
            if self.failure is not None:  # failed while this waiter queued: fail it too
                raise WakeUnavailable(str(self.failure)) from self.failure
            if self.closed:
                return None
            if self.idle is not None:
                self.idle.cancel()
                self.idle = None
            # New: neither waited on nor lingering (a lingering one is subscribed already).
            new = [c for c in channels if c not in self.waiters and c not in self.lingering]
            for channel in channels:
                self.lingering.pop(channel, None)
                self.waiters.setdefault(channel, set()).add(wakeup)
            try:
                if new:
                    for channel in new:
                        self.confirmed[channel] = self.loop.create_future()
                    await self.pubsub.subscribe(*new)
                    if self.reader is None:
                        self.reader = asyncio.create_task(self._read(), name="wake-reader")
            except (redis.RedisError, OSError) as error:
                self._fail(error)
            except BaseException:
                # Cancelled mid-subscribe (the client went away while a new hub connected):
                # this waiter leaves, and its new channels' pending confirmations with it,
                # so that the next waiter subscribes them again instead of waiting for a
                # confirmation that never comes.
                for channel in new:
                    future = self.confirmed.get(channel)
                    if future is not None and not future.done():
                        future.cancel()
                gone = self._forget(wakeup, channels)
                if gone:  # (perhaps subscribed after all: unsubscribed once the lock is free)
                    self.loop.create_task(self._unsubscribe_unused(gone))
                raise
            return [self.confirmed[c] for c in channels if c in self.confirmed]

    async def _confirmed(
        self, wakeup: Wakeup, channels: list[str], pending: list[asyncio.Future[None]]
    ) -> bool:
        try:
            async with asyncio.timeout(SUBSCRIBE_TIMEOUT):
                for future in pending:
                    await asyncio.shield(future)
        except BaseException as error:
            await self.remove(wakeup, channels)
            if isinstance(error, TimeoutError):
                raise WakeUnavailable("Redis did not confirm the subscription") from error
            raise
        if wakeup.error is not None:
            await self.remove(wakeup, channels)
            raise WakeUnavailable(str(wakeup.error)) from wakeup.error
        return True

    def _forget(
        self, wakeup: Wakeup, channels: list[str], linger_until: float | None = None
    ) -> list[str]:
        """(Synchronous: nothing can cut it short.) Take `wakeup` off `channels`; the ones
        left without waiters linger (until `linger_until`, or HARNESS_WAKE_LINGER from
        now) or are returned to be unsubscribed."""
        for channel in channels:
            waiting = self.waiters.get(channel)
            if waiting is not None:
                waiting.discard(wakeup)
                if not waiting:
                    del self.waiters[channel]
        if self.closed:
            return []
        if not self.waiters and self.idle is None:
            self.idle = self.loop.call_later(IDLE_CLOSE_AFTER, self._close_if_idle)
        gone = [c for c in channels if c not in self.waiters]
        # Confirmed channels linger; one still unconfirmed (its waiter gave up) goes.
        linger = settings.HARNESS_WAKE_LINGER
        expires = self.loop.time() + linger if linger_until is None else linger_until
        for channel in gone:
            if linger > 0 and channel not in self.confirmed and channel not in self.lingering:
                self.lingering[channel] = expires
        if self.lingering and self.sweep is None:
            self.sweep = self.loop.call_later(max(linger, 0.01), self._sweep)
        gone = [c for c in gone if c not in self.lingering]
        while len(self.lingering) > MAX_LINGERING:
            oldest = next(iter(self.lingering))
            del self.lingering[oldest]
            gone.append(oldest)
        for channel in gone:
            self.confirmed.pop(channel, None)
        return gone

    async def remove(
        self, wakeup: Wakeup, channels: list[str], linger_until: float | None = None
    ) -> None:
        gone = self._forget(wakeup, channels, linger_until)
        if gone:
            # Shielded: a cancelled request still unsubscribes what nobody listens to.
            await asyncio.shield(self._unsubscribe_unused(gone))

    async def _unsubscribe_unused(self, channels: list[str]) -> None:
        async with self.lock:
            if not self.closed:
                await self._unsubscribe(
                    [c for c in channels if c not in self.waiters and c not in self.lingering]
                )

    async def _unsubscribe(self, gone: list[str]) -> None:
        """(Under the lock.) Unsubscribe `gone`, which nobody waits on or lingers on (and
        has no confirmation pending: `_forget` dropped it, and lingering ones have none)."""
        if gone:
            try:
                await self.pubsub.unsubscribe(*gone)
            except (redis.RedisError, OSError) as error:
                self._fail(error)

    def _sweep(self) -> None:
        self.sweep = None
        if not self.closed:
            self.loop.create_task(self._expire_lingering())

    async def _expire_lingering(self) -> None:
        async with self.lock:
            if self.closed:
                return
            now = self.loop.time()
            gone = [c for c, expires in self.lingering.items() if expires <= now]
            for channel in gone:
                del self.lingering[channel]
            if self.lingering and self.sweep is None:
                first = min(self.lingering.values())
                self.sweep = self.loop.call_later(max(first - now, 0.01), self._sweep)
            await self._unsubscribe(gone)

    async def _read(self) -> None:
        try:
            while True:
                message = await self.pubsub.get_message(timeout=None)
                if message is None:
                    continue
                channel = message["channel"]
                channel = channel.decode() if isinstance(channel, bytes) else str(channel)
                if message["type"] == "subscribe":
                    future = self.confirmed.pop(channel, None)
                    if future is not None and not future.done():
                        future.set_result(None)
                elif message["type"] == "message":
                    data = message["data"]
                    news = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
                    for wakeup in list(self.waiters.get(channel, ())):
                        wakeup.wake(news=news)
        except asyncio.CancelledError:
            if not self.closed:  # the event loop is ending (asyncio.run's clean-up)
                self.closed = True
                self._detach()
                self.reader = None
                await self._disconnect()
            raise
        except Exception as error:  # the connection broke: every waiter answers now
            logger.warning("wake-up subscription failed", exc_info=True)
            self._fail(error)

    def _fail(self, error: BaseException) -> None:
        """Wake every waiter with `error` and retire this hub (the next waiter opens a new
        one); the connection is closed in the background."""
        self._detach()
        self.lingering.clear()
        if self.failure is None:
            self.failure = error
        for waiting in self.waiters.values():
            for wakeup in waiting:
                wakeup.wake(error)
        for future in self.confirmed.values():
            if not future.done():
                future.set_exception(WakeUnavailable(str(error)))
                future.exception()  # retrieved: never "exception was never retrieved"
        self.confirmed.clear()
        if not self.closed:
            self.closed = True
            self.loop.create_task(self._disconnect())

    def _detach(self) -> None:
        if _hubs.get(self.loop) is self:
            del _hubs[self.loop]

    def _close_if_idle(self) -> None:
        self.idle = None
        if not self.waiters and not self.closed:
            self.loop.create_task(self._close_when_idle())

    async def _close_when_idle(self) -> None:
        async with self.lock:
            if not self.waiters and not self.closed:
                await self._close()

    async def _close(self) -> None:
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        if self.sweep is not None:
            self.sweep.cancel()
            self.sweep = None
        self.lingering.clear()
        self.closed = True
        self._detach()
        await self._disconnect()

    async def _disconnect(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
        with contextlib.suppress(redis.RedisError, OSError):
            await self.pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2
            await self.client.aclose()
