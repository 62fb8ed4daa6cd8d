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

When Redis cannot be reached, waits fall back to this process's own count (the cap then
holds per process, as it did before it was shared) and sessions are not counted: a lost
count never refuses an agent that is within its share, and nothing runs without Redis
anyway (it is the broker).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid

import redis
from django.conf import settings

from dispatcher.models import Agent

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
# A slot outlives its wait by this much before it lapses on its own (a slow release).
LAPSE_MARGIN = 60.0


@functools.cache
def _client(url: str) -> redis.Redis:
    """A client with short timeouts: a cap's check must never hang a request."""
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def _key(kind: str, agent: Agent, *parts: object) -> str:
    """An agent's counter. The agent is named by its id and its token's random prefix: an
    id alone names another agent in another database on the same Redis (a second
    deployment, a test run), or after a rolled-back insert. (A rotated token starts a
    fresh count: the agent's admin gave it a new credential.)"""
    name = f"{agent.pk}-{agent.token_prefix}"
    return ":".join([settings.HARNESS_LIMITS_PREFIX, kind, name, *map(str, parts)])


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
    """Give a slot back (reserve_wait's answer). Never raises: an unreleased slot lapses."""
    key, _, member = slot.partition(" ")
    if key == "local":
        _local.release(member)
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
