"""Fair shares per agent and per person, whatever gateway a request came through
(docs/security.md, "Fair shares").

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

A person may hold many agents (each OAuth sign-in makes one, besides tokens pasted from
the dashboard), so the two caps that guard what every agent shares, the web processes'
threads and time, also hold per person, the agent's owner (its `owner_id`, on the agent
row every gateway already read): waits held by all of the person's agents together
(HARNESS_MAX_WAITS_PER_PERSON) and their requests together
(HARNESS_PERSON_REQUESTS_PER_SECOND). Each is taken in the same Redis script call as the
agent's own, so neither costs a round trip. An agent moved to another owner
(agents.transfer_agent, hand_over_agent) counts against the new owner from its next
request; the slots it holds meanwhile stay counted with the old owner until they are
given back or lapse. (Calls pending approval stay per agent: they hold no thread, and
expire.)

And before any of them, a request rate (HARNESS_AGENT_REQUESTS_PER_SECOND, with bursts of
HARNESS_AGENT_REQUEST_BURST): a token bucket per agent in Redis, taken by every gateway
(agent API, hooks, MCP) once the token is verified and before the request's body is
admitted (`take_request`). A refusal is remembered by the process that answered it, so
the same token is refused again without a read (`refused_early`; harness_site.asgi holds
it up to EARLY_HOLD first): a flood costs the web process next to nothing.

When Redis cannot be reached, waits fall back to this process's own count (the cap then
holds per process, as it did before it was shared; the slots so taken and still held
count against the caps in Redis once it is back) and sessions are not counted: a lost
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
from collections.abc import MutableMapping, Sequence
from typing import Any

import redis
from django.conf import settings

from dispatcher.models import Agent
from floor.redis_clients import Script, held

logger = logging.getLogger(__name__)

# Take one slot in every set of KEYS (the agent's, then its person's when capped) if each
# holds fewer than its cap, ARGV[3 + i] for KEYS[i]: ARGV[1] now, ARGV[2] when the slot
# lapses, ARGV[3] its member. 0 when taken; i when KEYS[i] is full (nothing taken). A set
# expires with its last slot to lapse, not with the newest (a short wait taken beside a
# long one must not take the long one with it when its key expires).
_RESERVE = """
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', ARGV[1])
  if redis.call('ZCARD', key) >= tonumber(ARGV[3 + i]) then return i end
end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, ARGV[2], ARGV[3])
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('EXPIREAT', key, math.ceil(tonumber(last[2])) + 1)
end
return 0
"""
# Count one new session in this minute: KEYS[1] the agent's counter of this minute.
_COUNT = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], 120) end
return n
"""
# Take one request from every bucket of KEYS (the agent's, then its person's when capped;
# each a hash of tokens and when they were counted), ARGV[2i - 1] tokens per second and
# ARGV[2i] the size of KEYS[i]. Redis's own clock, so every web process sees the same
# time. {1, 0, left, 0} when taken from all (`left`: the fewest whole tokens any has
# now); {0, ms, left, i} when one is empty (none taken), with how long until every
# bucket has a token, KEYS[i] the one that takes longest. A refused request counts too,
# in each empty bucket, down to a debt of one bucket: an agent that knocks again at once
# waits longer (up to twice the bucket's refill time), one that waits as told gets
# through.
_BUCKET = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local tokens, rates, bursts = {}, {}, {}
local full = true
for i, key in ipairs(KEYS) do
  local rate, burst = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local held = redis.call('HMGET', key, 'tokens', 'at')
  local n, at = tonumber(held[1]), tonumber(held[2])
  if n == nil or at == nil then n, at = burst, now end
  tokens[i], rates[i], bursts[i] = math.min(burst, n + math.max(0, now - at) * rate), rate, burst
  if tokens[i] < 1 then full = false end
end
local taken, wait, by, left = 0, 0, 0, nil
for i, key in ipairs(KEYS) do
  if full then
    tokens[i] = tokens[i] - 1
  elseif tokens[i] < 1 then
    if tokens[i] > -bursts[i] then tokens[i] = tokens[i] - 1 end
    local ms = math.ceil((1 - tokens[i]) / rates[i] * 1000)
    if ms > wait then wait, by = ms, i end
  end
  if left == nil or tokens[i] < left then left = tokens[i] end
  redis.call('HSET', key, 'tokens', tostring(tokens[i]), 'at', tostring(now))
  redis.call('PEXPIRE', key, math.ceil((bursts[i] - tokens[i]) / rates[i] * 1000) + 1000)
end
if full then taken = 1 end
return {taken, wait, math.floor(left), by}
"""
# A slot outlives its wait by this much before it lapses on its own (a slow release).
LAPSE_MARGIN = 60.0

# The ORM threads of one MCP gateway process (dispatcher.gateways.mcp.orm_threads): here,
# so that the start-up checks (HARNESS_MAX_WAITS_PER_PERSON below it) read it without
# importing the MCP SDK, which every management command would then load.
MCP_ORM_THREADS = 32


@functools.cache
def _client(url: str) -> redis.Redis:
    """A client with short timeouts: a cap's check must never hang a request."""
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


class _Script(Script):
    """One of this module's scripts, on `_client`'s pool (floor.redis_clients.Script)."""

    def __call__(self, keys: Sequence[str], args: Sequence[str | float]) -> Any:
        return self.run(_client(settings.REDIS_URL), keys, args)


_reserve, _count, _bucket = _Script(_RESERVE), _Script(_COUNT), _Script(_BUCKET)


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


def person_key(agent: Agent) -> str:
    """How the caps per person name the agent's owner: their id (`owner_id`, on the agent
    row already read: no query), and the database's name, so that person 5 of another
    database on the same Redis (a second deployment, a test run) is not this one."""
    database = str(settings.DATABASES["default"].get("NAME", ""))
    tag = _database_tags.get(database)
    if tag is None:
        tag = _database_tags.setdefault(database, hashlib.sha256(database.encode()).hexdigest()[:8])
    return f"{tag}-{agent.owner_id}"


_database_tags: dict[str, str] = {}


def _person(kind: str, agent: Agent) -> str:
    """The counter of `kind` of the agent's owner, shared by all of their agents."""
    return ":".join([settings.HARNESS_LIMITS_PREFIX, f"{kind}-person", person_key(agent)])


def waits_per_person_problem(value: str) -> str | None:
    """What is wrong with a HARNESS_MAX_WAITS_PER_PERSON value, or None."""
    if value.isascii() and value.isdigit():
        return None
    return (
        f"HARNESS_MAX_WAITS_PER_PERSON is {value!r}: it must be a whole number of waits "
        "(0: no cap per person)"
    )


def waits_per_person() -> int:
    """How many waits one person's agents may hold together (0: no cap per person). A
    value the start-up check refuses counts as the default, 16."""
    value = str(settings.HARNESS_MAX_WAITS_PER_PERSON).strip()
    return int(value) if waits_per_person_problem(value) is None else 16


class LocalSlots:
    """The fallback: how many waits of each agent this process holds (any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}

    def reserve(self, agent: str, limit: int, *more: tuple[str, int]) -> int:
        """Take one of `agent`'s `limit` and of each of `more` (a key and its limit): 0
        when taken, else which was full (1 for `agent`, 2 for more[0], ...)."""
        counts = [(agent, limit), *more]
        with self._lock:
            for i, (key, cap) in enumerate(counts, 1):
                if self._held.get(key, 0) >= cap:
                    return i
            for key, _ in counts:
                self._held[key] = self._held.get(key, 0) + 1
            return 0

    def held(self, key: str) -> int:
        """How many of `key`'s slots this process holds in its own count."""
        with self._lock:
            return self._held.get(key, 0)

    def release(self, agent: str, *more: str) -> None:
        with self._lock:
            for key in (agent, *more):
                held = self._held.get(key, 0) - 1
                if held > 0:
                    self._held[key] = held
                else:
                    self._held.pop(key, None)


_local = LocalSlots()


class TooManyWaits(Exception):
    """No wait slot was taken: the agent holds HARNESS_MAX_WAITS_PER_AGENT of them, or its
    person's agents hold HARNESS_MAX_WAITS_PER_PERSON together (`cap`: whose)."""

    def __init__(self, cap: str) -> None:
        self.cap = cap
        super().__init__(self.message(""))

    def message(self, then: str) -> str:
        """The text every gateway sends with the refusal; `then` says what to do next."""
        waits = "(agent API waits, hook requests and MCP calls together"
        if self.cap == "person":
            limit = waits_per_person()
            text = (
                f"This agent's owner already has {limit} requests waiting in Harness across "
                f"all of their agents {waits}; HARNESS_MAX_WAITS_PER_PERSON)."
            )
        else:
            limit = settings.HARNESS_MAX_WAITS_PER_AGENT
            text = (
                f"This agent already holds {limit} requests waiting in Harness "
                f"{waits}; HARNESS_MAX_WAITS_PER_AGENT)."
            )
        return f"{text} {then}".strip()


def reserve_wait(agent: Agent, seconds: float) -> str:
    """Take one of the agent's HARNESS_MAX_WAITS_PER_AGENT wait slots, and one of its
    person's HARNESS_MAX_WAITS_PER_PERSON (both or neither, in one script call), for a
    wait of up to `seconds` (it lapses LAPSE_MARGIN later if never released): the slot to
    give back with release_wait. Raises TooManyWaits, nothing taken, when either is full."""
    keys, caps = [_key("waits", agent)], [settings.HARNESS_MAX_WAITS_PER_AGENT]
    if (per_person := waits_per_person()) > 0:
        keys.append(_person("waits", agent))
        caps.append(per_person)
    member = uuid.uuid4().hex
    now = time.time()
    # Slots this process took in its own count while Redis was down, and holds still (an
    # MCP call held for a reviewer re-reads it meanwhile), are not in Redis's sets: they
    # leave that many fewer there, or a person's agents would hold their waits twice over
    # in this process (all of its ORM threads) once Redis is back.
    shared = [max(0, cap - _local.held(key)) for key, cap in zip(keys, caps, strict=True)]
    try:
        full = _reserve(keys, [now, now + seconds + LAPSE_MARGIN, member, *shared])
    except Exception:
        logger.warning("wait slots unavailable in Redis; counting in this process", exc_info=True)
        full = _local.reserve(keys[0], caps[0], *zip(keys[1:], caps[1:], strict=True))
        member = "local"
    if int(full):
        raise TooManyWaits("person" if int(full) == 2 else "agent")
    return " ".join([member, *keys])


def release_wait(slot: str) -> None:
    """Give a slot back (reserve_wait's answer: its member, then the sets it is in): kept
    for the thread's round trip to Redis when one is open (redis_clients.one_round_trip,
    sent before it ends). Never raises: an unreleased slot lapses."""
    member, *keys = slot.split(" ")
    if member == "local":
        _local.release(*keys)
        return
    if (trip := held(settings.REDIS_URL)) is not None:
        for key in keys:
            trip.add(("ZREM", key, member), f"the wait slot {member} in {key}")
        return
    try:
        if len(keys) == 1:
            _client(settings.REDIS_URL).zrem(keys[0], member)
        else:
            pipe = _client(settings.REDIS_URL).pipeline(transaction=False)
            for key in keys:
                pipe.zrem(key, member)
            pipe.execute()
    except Exception:
        logger.warning("could not release the wait slot %s", slot, exc_info=True)


def waits_held(agent: Agent) -> int:
    """How many wait slots the agent holds now (in every process)."""
    return int(_client(settings.REDIS_URL).zcount(_key("waits", agent), time.time(), "+inf"))


def person_waits_held(agent: Agent) -> int:
    """How many wait slots the agent's owner holds now, with all of their agents."""
    return int(_client(settings.REDIS_URL).zcount(_person("waits", agent), time.time(), "+inf"))


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
        started = int(_count([_key("sessions", agent, minute)], []))
    except Exception:
        logger.warning("session counter unavailable in Redis; not counted", exc_info=True)
        return
    if started > limit:
        raise TooManySessions(retry_after=max(1, 60 - int(now % 60)))


def retry_after_wait() -> int:
    """What a refused wait's Retry-After says: a few seconds (a wait ends when its call is
    decided, which nobody can foretell)."""
    return 5


def too_many_asks_message() -> str:
    limit = settings.HARNESS_MAX_PENDING_ASKS_PER_AGENT
    return (
        f"Denied without asking a reviewer: this agent already has {limit} calls waiting "
        "for a reviewer's decision (HARNESS_MAX_PENDING_ASKS_PER_AGENT). Wait until some of "
        "them are decided, then propose this call again."
    )


class TooManyRequests(Exception):
    """The agent sent more than its HARNESS_AGENT_REQUESTS_PER_SECOND (after its burst), or
    its person's agents together more than HARNESS_PERSON_REQUESTS_PER_SECOND (`cap`)."""

    def __init__(self, retry_after_ms: int, cap: str = "agent") -> None:
        self.retry_after_ms = retry_after_ms
        self.retry_after = max(1, math.ceil(retry_after_ms / 1000))
        self.cap = cap
        if cap == "person":
            rate = settings.HARNESS_PERSON_REQUESTS_PER_SECOND
            burst = settings.HARNESS_PERSON_REQUEST_BURST
            who, name = "This agent's owner, with all of their agents,", "PERSON"
        else:
            rate = settings.HARNESS_AGENT_REQUESTS_PER_SECOND
            burst = settings.HARNESS_AGENT_REQUEST_BURST
            who, name = "This agent", "AGENT"
        super().__init__(
            f"{who} sent requests faster than {rate:g} per second (bursts of {burst}; "
            f"HARNESS_{name}_REQUESTS_PER_SECOND, counted across the agent API, hooks and "
            "MCP), so this request was not read and nothing was recorded. Send it again "
            f"after {self.retry_after} second{'s' if self.retry_after != 1 else ''}, and "
            "space out requests (wait for results with ?wait= rather than polling)."
        )


# Refusals this process has answered, by the digest of the token refused: until the
# bucket can hold a token again, the same token is refused here without a database read
# or a Redis call (only this agent's own requests take from its bucket, so the answer
# cannot change before then; these refusals are not counted in Redis). Only a token
# verified and refused by `take_request` is remembered: no other token is refused by it.
_refused_until: dict[str, float] = {}
# ... and of those, the ones refused for their person's rate (what the refusal then says).
# (Other agents of the person also take from the person's bucket, so the bucket may be
# emptier when the refusal ends: never fuller before, so it holds until then.)
_by_person: set[str] = set()
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
    keys: list[str] = []
    args: list[float] = []
    caps: list[str] = []
    if (rate := settings.HARNESS_AGENT_REQUESTS_PER_SECOND) > 0:
        keys.append(_key("rate", agent))
        args += [rate, max(1, settings.HARNESS_AGENT_REQUEST_BURST)]
        caps.append("agent")
    if (rate := settings.HARNESS_PERSON_REQUESTS_PER_SECOND) > 0:
        keys.append(_person("rate", agent))
        args += [rate, max(1, settings.HARNESS_PERSON_REQUEST_BURST)]
        caps.append("person")
    if not keys:
        return
    try:
        taken, wait, left, by = _bucket(keys, args)
    except Exception:
        logger.warning("request rate unavailable in Redis; not counted", exc_info=True)
        return
    if int(taken):
        if _refused_until and int(left) >= 1:
            # The buckets have more to give: the requests held here may all go on. (At a
            # last token the refusal stays: one request per token, refused_early.)
            digest = _digest(token)
            _refused_until.pop(digest, None)
            _by_person.discard(digest)
        return
    if len(_refused_until) >= _REMEMBERED:
        now = time.monotonic()
        # (over a copy: the event loop's thread renews refusals meanwhile, refused_early)
        for digest in [d for d, until in list(_refused_until.items()) if until <= now]:
            _refused_until.pop(digest, None)
            _by_person.discard(digest)
    cap = caps[int(by) - 1] if 0 < int(by) <= len(caps) else "agent"
    if len(_refused_until) < _REMEMBERED:
        digest = _digest(token)
        _refused_until[digest] = time.monotonic() + int(wait) / 1000
        if cap == "person":
            _by_person.add(digest)
        else:
            _by_person.discard(digest)
    raise TooManyRequests(int(wait), cap)


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
    if not _refused_until or (scope is not None and scope.get(_LET_THROUGH)):
        return None
    digest = _digest(token)
    until = _refused_until.get(digest)
    if until is None:
        return None
    if digest in _by_person:
        rate = settings.HARNESS_PERSON_REQUESTS_PER_SECOND
    if rate <= 0:
        return None
    now = time.monotonic()
    if until <= now - EARLY_HOLD - 1 / rate:
        # Ran out long enough ago that no request is held for it (each held request
        # wakes when it runs out): the bucket has filled since, and the refusal is
        # forgotten, or an agent refused once would have its requests let through one
        # by one for good (and a request that never reaches the bucket, renewing it,
        # would have the next ones refused from memory with a full bucket).
        _refused_until.pop(digest, None)
        _by_person.discard(digest)
        return None
    if until <= now:
        _refused_until[digest] = now + 1 / rate
        if scope is not None:
            scope[_LET_THROUGH] = True
        return None
    return TooManyRequests(
        math.ceil((until - now) * 1000), "person" if digest in _by_person else "agent"
    )


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
