"""Fair shares per agent, whatever gateway a request came through (docs/security.md).

Three caps hold per agent across every web process, so the counts live where all of them
look (Redis for the two that change on every request, the database for the third):

- waits held at once (HARNESS_MAX_WAITS_PER_AGENT): a request of the agent API with
  `?wait=`, a hook request held while a reviewer decides, an MCP `tools/call` held until
  its call is done. Each holds a slot, a member of the agent's sorted set whose score is
  when it lapses (a process that died holding slots gives them back when they lapse);
- new sessions per minute (HARNESS_MAX_SESSIONS_PER_MINUTE): a counter per agent and
  minute, for every way a session starts (the API, a hook's first sight of a client
  session, an MCP initialize);
- calls pending approval (HARNESS_MAX_PENDING_ASKS_PER_AGENT): counted in the database by
  admission, only for a call that would ask (dispatcher.admission).

And before any of them, a request rate (HARNESS_AGENT_REQUESTS_PER_SECOND, with bursts of
HARNESS_AGENT_REQUEST_BURST): a token bucket per agent in Redis, taken by every gateway
(agent API, hooks, MCP) once the token is verified and before the request's body is
admitted (`take_request`). A refusal is remembered by the process that answered it, so
the same token is refused again without a read (`refused_early`; harness_site.asgi holds
it up to EARLY_HOLD first): a flood costs the web process next to nothing.

When Redis cannot be reached, waits fall back to this process's own count (the cap then
holds per process, as it did before it was shared) and sessions are not counted: a lost
count never refuses an agent that is within its share, and nothing runs without Redis
anyway (it is the broker).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import threading
import time
import uuid
from collections.abc import MutableMapping
from typing import Any

import redis
from django.conf import settings

from dispatcher.models import Agent
from floor.redis_clients import held

logger = logging.getLogger(__name__)

# Take one slot if fewer than ARGV[3] are held: KEYS[1] the agent's set, ARGV[1] now,
# ARGV[2] when the slot lapses, ARGV[4] its member. 1 when taken, 0 when all are held.
_RESERVE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIREAT', KEYS[1], math.ceil(tonumber(ARGV[2])) + 1)
return 1
"""
# Count one new session in this minute: KEYS[1] the agent's counter of this minute.
_COUNT = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], 120) end
return n
"""
# Take one request from the agent's bucket: KEYS[1] the bucket (a hash of tokens and when
# they were counted), ARGV[1] tokens per second, ARGV[2] the bucket's size. Redis's own
# clock, so every web process sees the same time. {1, 0} when taken; {0, ms} when empty,
# with how long until a token is back. A refused request counts too, down to a debt of
# one bucket: an agent that knocks again at once waits longer (up to twice the bucket's
# refill time), one that waits as told gets through.
_BUCKET = """
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local held = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(held[1]), tonumber(held[2])
if tokens == nil or at == nil then tokens, at = burst, now end
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local taken, wait = 0, 0
if tokens >= 1 then
  tokens, taken = tokens - 1, 1
else
  if tokens > -burst then tokens = tokens - 1 end
  wait = math.ceil((1 - tokens) / rate * 1000)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return {taken, wait, math.floor(tokens)}
"""
# A slot outlives its wait by this much before it lapses on its own (a slow release).
LAPSE_MARGIN = 60.0


@functools.cache
def _client(url: str) -> redis.Redis:
    """A client with short timeouts: a cap's check must never hang a request."""
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def agent_key(agent: Agent) -> str:
    """How every cap names an agent: its id and its token's random prefix, both read from
    the database with the verified token (never from what the request says). An id alone
    names another agent in another database on the same Redis (a second deployment, a
    test run), or after a rolled-back insert. (A rotated token starts a fresh count: the
    agent's admin gave it a new credential, and the old one no longer authenticates.)"""
    return f"{agent.pk}-{agent.token_prefix}"


def _key(kind: str, agent: Agent, *parts: object) -> str:
    """An agent's counter of `kind` (`agent_key` names the agent)."""
    return ":".join([settings.HARNESS_LIMITS_PREFIX, kind, agent_key(agent), *map(str, parts)])


class LocalSlots:
    """The fallback: how many waits of each agent this process holds (any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}

    def reserve(self, agent: str, limit: int) -> bool:
        with self._lock:
            held = self._held.get(agent, 0)
            if held >= limit:
                return False
            self._held[agent] = held + 1
            return True

    def release(self, agent: str) -> None:
        with self._lock:
            held = self._held.get(agent, 0) - 1
            if held > 0:
                self._held[agent] = held
            else:
                self._held.pop(agent, None)


_local = LocalSlots()


def reserve_wait(agent: Agent, seconds: float) -> str | None:
    """Take one of the agent's HARNESS_MAX_WAITS_PER_AGENT wait slots for a wait of up to
    `seconds` (it lapses LAPSE_MARGIN later if never released); the slot to give back
    with release_wait, or None when the agent holds all of them (nothing taken)."""
    key, limit = _key("waits", agent), settings.HARNESS_MAX_WAITS_PER_AGENT
    member = uuid.uuid4().hex
    now = time.time()
    try:
        taken = _client(settings.REDIS_URL).eval(
            _RESERVE, 1, key, now, now + seconds + LAPSE_MARGIN, limit, member
        )
    except Exception:
        logger.warning("wait slots unavailable in Redis; counting in this process", exc_info=True)
        return f"local {key}" if _local.reserve(key, limit) else None
    return f"{key} {member}" if taken else None


def release_wait(slot: str) -> None:
    """Give a slot back (reserve_wait's answer): kept for the thread's round trip to Redis
    when one is open (redis_clients.one_round_trip, sent before it ends). Never raises: an
    unreleased slot lapses."""
    key, _, member = slot.partition(" ")
    if key == "local":
        _local.release(member)
        return
    if (trip := held(settings.REDIS_URL)) is not None:
        trip.add(("ZREM", key, member), f"the wait slot {slot}")
        return
    try:
        _client(settings.REDIS_URL).zrem(key, member)
    except Exception:
        logger.warning("could not release the wait slot %s", slot, exc_info=True)


def waits_held(agent: Agent) -> int:
    """How many wait slots the agent holds now (in every process)."""
    return int(_client(settings.REDIS_URL).zcount(_key("waits", agent), time.time(), "+inf"))


class TooManySessions(Exception):
    """The agent started HARNESS_MAX_SESSIONS_PER_MINUTE sessions this minute."""

    def __init__(self, retry_after: int) -> None:
        self.retry_after = retry_after
        limit = settings.HARNESS_MAX_SESSIONS_PER_MINUTE
        super().__init__(
            f"This agent started {limit} sessions in the last minute "
            f"(HARNESS_MAX_SESSIONS_PER_MINUTE), so no new session was started. Go on in a "
            f"session it already has, or start one after {retry_after} seconds."
        )


def count_new_session(agent: Agent) -> None:
    """Count one new session of the agent in this calendar minute (one counter per agent
    and minute). Raises TooManySessions when this one passes the cap: the caller starts
    nothing. Refused attempts count too, so retrying at once does not help."""
    limit = settings.HARNESS_MAX_SESSIONS_PER_MINUTE
    if limit <= 0:
        return
    now = time.time()
    minute = int(now // 60)
    try:
        started = int(_client(settings.REDIS_URL).eval(_COUNT, 1, _key("sessions", agent, minute)))
    except Exception:
        logger.warning("session counter unavailable in Redis; not counted", exc_info=True)
        return
    if started > limit:
        raise TooManySessions(retry_after=max(1, 60 - int(now % 60)))


def retry_after_wait() -> int:
    """What a refused wait's Retry-After says: a few seconds (a wait ends when its call is
    decided, which nobody can foretell)."""
    return 5


def too_many_waits_message(then: str) -> str:
    """The text every gateway sends with a refused wait; `then` says what to do next."""
    limit = settings.HARNESS_MAX_WAITS_PER_AGENT
    return (
        f"This agent already holds {limit} requests waiting in Harness (agent API waits, "
        f"hook requests and MCP calls together; HARNESS_MAX_WAITS_PER_AGENT). {then}"
    )


def too_many_asks_message() -> str:
    limit = settings.HARNESS_MAX_PENDING_ASKS_PER_AGENT
    return (
        f"Denied without asking a reviewer: this agent already has {limit} calls waiting "
        "for a reviewer's decision (HARNESS_MAX_PENDING_ASKS_PER_AGENT). Wait until some of "
        "them are decided, then propose this call again."
    )


class TooManyRequests(Exception):
    """The agent sent more than its HARNESS_AGENT_REQUESTS_PER_SECOND (after its burst)."""

    def __init__(self, retry_after_ms: int) -> None:
        self.retry_after_ms = retry_after_ms
        self.retry_after = max(1, math.ceil(retry_after_ms / 1000))
        rate = settings.HARNESS_AGENT_REQUESTS_PER_SECOND
        burst = settings.HARNESS_AGENT_REQUEST_BURST
        super().__init__(
            f"This agent sent requests faster than {rate:g} per second (bursts of {burst}; "
            "HARNESS_AGENT_REQUESTS_PER_SECOND, counted across the agent API, hooks and MCP), "
            f"so this request was not read and nothing was recorded. Send it again after "
            f"{self.retry_after} second{'s' if self.retry_after != 1 else ''}, and space "
            "out requests (wait for results with ?wait= rather than polling)."
        )


@functools.cache
def _bucket_script(url: str) -> Any:
    return _client(url).register_script(_BUCKET)


# Refusals this process has answered, by the digest of the token refused: until the
# bucket can hold a token again, the same token is refused here without a database read
# or a Redis call (only this agent's own requests take from its bucket, so the answer
# cannot change before then; these refusals are not counted in Redis). Only a token
# verified and refused by `take_request` is remembered: no other token is refused by it.
_refused_until: dict[str, float] = {}
_REMEMBERED = 10_000
# How long an early refusal is held before it is answered (harness_site.asgi), in seconds.
EARLY_HOLD = 1.0
# The scope key of a request `refused_early` let through (its handler does not ask again).
_LET_THROUGH = "harness.rate_let_through"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def take_request(agent: Agent, token: str) -> None:
    """Take one request from the agent's bucket (every gateway, once `token` is verified as
    the agent's, before anything of the request is admitted). Raises TooManyRequests when
    the bucket is empty: the caller answers 429 with Retry-After and records nothing. A
    refused request counts too (`_BUCKET`), yet an agent that waits as told gets through,
    and this process answers the same token from memory until then. Off when
    the rate is 0; when Redis cannot be reached the request goes on (a lost count never
    refuses an agent within its share)."""
    rate = settings.HARNESS_AGENT_REQUESTS_PER_SECOND
    if rate <= 0:
        return
    burst = max(1, settings.HARNESS_AGENT_REQUEST_BURST)
    try:
        taken, wait, left = _bucket_script(settings.REDIS_URL)(
            keys=[_key("rate", agent)], args=[rate, burst]
        )
    except Exception:
        logger.warning("request rate unavailable in Redis; not counted", exc_info=True)
        return
    if int(taken):
        if _refused_until and int(left) >= 1:
            # The bucket has more to give: the requests held here may all go on. (At its
            # last token the refusal stays: one request per token, refused_early.)
            _refused_until.pop(_digest(token), None)
        return
    if len(_refused_until) >= _REMEMBERED:
        now = time.monotonic()
        # (over a copy: the event loop's thread renews refusals meanwhile, refused_early)
        for digest in [d for d, until in list(_refused_until.items()) if until <= now]:
            _refused_until.pop(digest, None)
    if len(_refused_until) < _REMEMBERED:
        _refused_until[_digest(token)] = time.monotonic() + int(wait) / 1000
    raise TooManyRequests(int(wait))


def refused_early(
    token: str, scope: MutableMapping[str, Any] | None = None
) -> TooManyRequests | None:
    """The refusal this process answered `token` with moments ago, while it still holds
    (checked before the token is even read from the database); None otherwise.

    When the refusal has run out, one request goes on to the bucket and the refusal is
    renewed for the time the bucket takes to gain one token (1/rate): the requests this
    process holds for the token (harness_site.asgi) wake together, and all of them reaching
    the handler at once is a burst of reads and Redis calls the bucket refuses anyway
    (battery row D9). The bucket's answer then ends the refusal (a token taken) or renews
    it (`take_request`). A request already let through here, by the ASGI router, is not
    checked again by its handler (`scope`)."""
    rate = settings.HARNESS_AGENT_REQUESTS_PER_SECOND
    if not _refused_until or rate <= 0 or (scope is not None and scope.get(_LET_THROUGH)):
        return None
    digest = _digest(token)
    until = _refused_until.get(digest)
    if until is None:
        return None
    now = time.monotonic()
    if until <= now - EARLY_HOLD - 1 / rate:
        # Ran out long enough ago that no request is held for it (each held request
        # wakes when it runs out): the bucket has filled since, and the refusal is
        # forgotten, or an agent refused once would have its requests let through one
        # by one for good (and a request that never reaches the bucket, renewing it,
        # would have the next ones refused from memory with a full bucket).
        _refused_until.pop(digest, None)
        return None
    if until <= now:
        _refused_until[digest] = now + 1 / rate
        if scope is not None:
            scope[_LET_THROUGH] = True
        return None
    return TooManyRequests(math.ceil((until - now) * 1000))


def refused_scope(scope: MutableMapping[str, Any]) -> TooManyRequests | None:
    """`refused_early` for an ASGI request's bearer token (None without one); a request it
    lets through is marked in `scope`, so its handler does not check it again."""
    if not _refused_until:
        return None
    for name, value in scope.get("headers", ()):
        if name.lower() == b"authorization":
            kind, _, token = value.decode("latin-1").partition(" ")
            if kind.lower() != "bearer":
                return None
            return refused_early(token.strip(), scope)
    return None
