"""Batch order: which queued calls of one assistant message may start now, and the
workers' messages for them (only the call id, sent after commit).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import math
import uuid
from typing import Any, NamedTuple

import redis
from celery import current_app
from celery.signals import worker_init
from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from audit import kinds
from audit.models import AuditEvent
from dispatcher.models import TERMINAL_STATUSES, AgentSession, Executor, Status, ToolCall
from dispatcher.tools.registry import get_tool
from floor import celery_message
from floor.compiled import Compiled
from floor.redis_clients import Script, held, redis_at

EXECUTE_TASK = "dispatcher.tasks.execute_call"

logger = logging.getLogger(__name__)


# The execution lane is shared by every agent, and Celery serves its queue in order: one
# agent's thousands of queued calls (64 a message, 20 messages a second) held another
# agent's read behind all of them (13 s behind 1,280 listings on 4 worker processes).
# So the queue's messages are turns, not calls: each push adds the call to its agent's
# list in Redis and one message; a worker taking a message runs the next call of the next
# agent of the next owner (`_TAKE`): a ring of the owners (people) with calls waiting,
# each with a ring of its agents with calls waiting, each with its list. An agent goes
# back to its owner's ring's end while it has calls left, and the owner to the ring's end
# while any of its agents has. A person's call then waits for at most one call of each
# other person with calls queued, after the calls already running, however many agents
# each holds (turns per agent gave a person with fifty agents fifty turns for another's
# one). Within one agent, its calls keep their order; one owner's agents take turns.
# An agent moved to another owner (`agents.transfer_agent`) while it has calls listed
# moves with them: its list records the owner whose ring it is in (`<list>:owner`); a push
# naming another owner puts the agent in that owner's ring (LPOS only then, reading one
# owner's agents), and a take finding it in its former owner's ring drops that place.
# Without it, an agent that kept sending never left its former owner's ring (its list
# never emptied): its calls waited among that person's agents, and a re-send gave it a
# second place, a turn in two people's shares (`tests/redteam/test_rtown2_transfer.py`).
# (KEYS: the owners' ring, the agent's list, the queue, the set of the list's calls, the
# owner's ring of agents, the list's owner; ARGV: the call, the agent, the message, the
# owner's entry.)
_PUSH = """
if redis.call('RPUSH', KEYS[2], ARGV[1]) == 1 then
  redis.call('SET', KEYS[6], ARGV[4])
  if redis.call('RPUSH', KEYS[5], ARGV[2]) == 1 then
    redis.call('RPUSH', KEYS[1], ARGV[4])
  end
elseif redis.call('GET', KEYS[6]) ~= ARGV[4] then
  redis.call('SET', KEYS[6], ARGV[4])
  if not redis.call('LPOS', KEYS[5], ARGV[2]) then
    if redis.call('RPUSH', KEYS[5], ARGV[2]) == 1 then
      redis.call('RPUSH', KEYS[1], ARGV[4])
    end
  end
end
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('EXPIRE', KEYS[2], 86400)
redis.call('EXPIRE', KEYS[4], 86400)
redis.call('EXPIRE', KEYS[5], 86400)
redis.call('EXPIRE', KEYS[6], 86400)
redis.call('LPUSH', KEYS[3], ARGV[3])
"""
# The reconciler's re-send of a call queued too long (and a worker's give-back of a call
# whose workspace was busy, or whose owner's place it could not hold): its message was
# lost (a worker killed holding it, Redis restarted) or is only late. A call still in its
# agent's list (the set beside it says so without reading the list: a flood's lists are
# long) gets one more message and no second place (a list with more calls than messages
# would leave its last call waiting for the reconciler after every burst, for good); a
# call the list lost gets both (a set that outlived its list is dropped first: its calls
# are listed again by their own re-sends).
# An agent whose place outlived its list's (its owner's ring deleted or evicted alone),
# or an owner whose place in the ring was lost, is put back: each joins only when the
# level below was empty, so its calls were otherwise never taken again and its list grew
# for good (LPOS reads the owners' ring, one entry per owner with calls waiting, and the
# owner's ring, one per agent of it with calls waiting, only on a re-send).
_RESEND = """
if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('DEL', KEYS[4]) end
if redis.call('SISMEMBER', KEYS[4], ARGV[1]) == 0 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  redis.call('SADD', KEYS[4], ARGV[1])
  redis.call('EXPIRE', KEYS[2], 86400)
  redis.call('EXPIRE', KEYS[4], 86400)
end
redis.call('SET', KEYS[6], ARGV[4], 'EX', 86400)
if not redis.call('LPOS', KEYS[5], ARGV[2]) then redis.call('RPUSH', KEYS[5], ARGV[2]) end
redis.call('EXPIRE', KEYS[5], 86400)
if not redis.call('LPOS', KEYS[1], ARGV[4]) then redis.call('RPUSH', KEYS[1], ARGV[4]) end
redis.call('LPUSH', KEYS[3], ARGV[3])
"""
# Which Redis process the running sets were counted on, for the scripts that read their
# mark (`_counted_key`; prepended to them): its run_id (INFO server), new at every start.
# A Redis that came back from an older snapshot (a restart that loaded its dump, a backup
# restored, a replica promoted) brings back the mark of that moment with the sets of that
# moment, which lack every call started since: its run_id is another, so that mark is no
# mark and the sets are counted again. `this_redis_mark(key)`: the mark at `key` if this
# process's, else false. (INFO inside a script: Redis 5 and later, whose scripts replicate
# their writes, not their text.)
_THIS_REDIS = """
local function this_redis()
  local id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  if not id then error('no run_id in INFO server: the running places cannot be checked') end
  return id
end
local function this_redis_mark(key)
  local mark = redis.pcall('GET', key)
  if type(mark) ~= 'string' then return false end
  local prefix = this_redis() .. ':'
  if mark:sub(1, #prefix) ~= prefix then return false end
  return mark
end
"""
# A place whose level below was lost (an owner with no agents left listed, an agent with
# no calls) is dropped and the next one tried, and so is an agent's place in the ring of
# an owner it no longer has (its list's owner is another: it has a place there); every
# pass takes one entry away for good or returns a call, so the loop ends. (A list of no
# recorded owner, listed by an earlier version, is taken where found.)
#
# With a cap on each owner's running calls (ARGV[3] > 0, `running_cap`), an owner with
# that many places in its set of running calls (`<queue>:fair:running:<owner>`: a token
# per turn, scored with the time its place lapses) is passed over: it keeps its place in
# the ring, and its calls their order, and the next owner is tried. The owner whose call
# is taken gets a place that lapses after ARGV[6] seconds (the worker's `hold` moves it to
# the call's lease at its claim; `end_turn` gives it back). When every owner with calls
# waiting was passed over, the message's turn is owed (`<queue>:fair:owed`): the next
# place given back sends a message for it (`_RELEASE`), so the listed calls keep as many
# messages as they had. A place of a worker killed running its call lapses with the
# call's lease (then the reconciler re-sends what waited: a lapse sends no message).
# Without the running sets' mark of this Redis process (`_counted_key`: Redis lost its
# data, or came back from an older snapshot) nothing is taken (-1) until the sets are
# counted again (`count_running`).
# (KEYS: the owners' ring, the owed turns, the mark; ARGV: the lists' prefix, the owners'
# rings' prefix, the cap, the running sets' prefix, the turn's token, its lapse, the sets'
# expiry.)
_TAKE = (
    _THIS_REDIS
    + """
local cap = tonumber(ARGV[3])
local now = 0
if cap > 0 then
  if not this_redis_mark(KEYS[3]) then return -1 end
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local passed = {}
local taken = false
while not taken do
  local owner = redis.call('LPOP', KEYS[1])
  if not owner then break end
  local running = ARGV[4] .. owner
  local full = false
  if cap > 0 then
    redis.call('ZREMRANGEBYSCORE', running, '-inf', now)
    full = redis.call('ZCARD', running) >= cap
  end
  if full then
    passed[#passed + 1] = owner
  else
    local agents = ARGV[2] .. owner
    local agent = redis.call('LPOP', agents)
    if agent then
      local calls = ARGV[1] .. agent
      local of = redis.call('GET', calls .. ':owner')
      if not of or of == owner then
        local call = redis.call('LPOP', calls)
        if call then
          redis.call('SREM', calls .. ':in', call)
          taken = {call, running}
        end
        if redis.call('LLEN', calls) > 0 then
          redis.call('RPUSH', agents, agent)
        elseif of then
          redis.call('DEL', calls .. ':owner')
        end
      end
      if redis.call('LLEN', agents) > 0 then redis.call('RPUSH', KEYS[1], owner) end
    end
  end
end
for i = #passed, 1, -1 do redis.call('LPUSH', KEYS[1], passed[i]) end
if taken and redis.call('EXISTS', KEYS[1]) == 0 then redis.call('DEL', KEYS[2]) end
if taken then
  if cap == 0 then return {taken[1], ''} end
  redis.call('ZADD', taken[2], string.format('%.6f', now + tonumber(ARGV[6])), ARGV[5])
  redis.call('EXPIRE', taken[2], ARGV[7])
  return {taken[1], taken[2]}
end
if #passed > 0 then
  redis.call('INCR', KEYS[2])
  redis.call('EXPIRE', KEYS[2], 86400)
  return 0
end
return false
"""
)
# A turn's place given back (KEYS: the owner's running set, the owed turns, the queue, the
# owners' ring; ARGV: the token, the kinds of the gaps of the owed turn's message's
# template, the JSON of the sender's root and parent ids, the place `count_running` gave
# the call if this turn ran it, then the template's parts). One owed turn at most: one
# place freed lets one more call start. With no owner's calls waiting (the ring empty),
# no turn is owed any more (a take that empties the ring drops them too): messages left
# over (the reconciler's re-sends of calls that waited) would otherwise keep a count
# that sends messages for nothing. The owed turn's message is made here, only when one
# is owed, from the process's template
# (celery_message.task_message_template): its parts joined by the turn's token as the
# task id (a uuid4's hex, one message at most per turn), by its halves swapped as the
# delivery tag, and by the sender's lineage (no root: the message's own id). Building
# one in Python for every call given back cost the worker more than the rest of the
# give-back (issue 37), and a message built once and reused could be pushed twice under
# one id (the pipelined give-back never reads the reply). The template's marks were once
# replaced by their text, wherever it stood: a queue whose name held it had it replaced.
_RELEASE = """
redis.call('ZREM', KEYS[1], ARGV[1], ARGV[5])
if redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('DEL', KEYS[2])
elseif tonumber(redis.call('GET', KEYS[2]) or '0') > 0 then
  redis.call('DECR', KEYS[2])
  local function uuid(h)
    return '"' .. h:sub(1, 8) .. '-' .. h:sub(9, 12) .. '-' .. h:sub(13, 16) .. '-'
      .. h:sub(17, 20) .. '-' .. h:sub(21, 32) .. '"'
  end
  local id = uuid(ARGV[1])
  local values = {I = id, T = uuid(ARGV[1]:sub(17) .. ARGV[1]:sub(1, 16)), P = ARGV[4]}
  values.R = ARGV[3] ~= '' and ARGV[3] or id
  local kinds = ARGV[2]
  local message = {ARGV[6]}
  for i = 1, #kinds do
    message[2 * i] = values[kinds:sub(i, i)]
    message[2 * i + 1] = ARGV[6 + i]
  end
  redis.call('LPUSH', KEYS[3], table.concat(message))
end
"""
# The place of a turn whose call is about to be claimed, moved to lapse with the call's
# lease (KEYS: the owner's running set, the mark; ARGV: the token, the lease's seconds,
# the set's expiry, the cap). To the microsecond, as the worker's lease is (its whole
# seconds alone lapsed the place up to a second before the lease; a Lua number handed to
# Redis keeps 14 digits, so the score is formatted). A token no longer in the set is a
# place taken anew, only below the cap, else nothing is held (0): a take's place that
# lapsed before its hold (a re-check, a workspace lock slower than the grace) may have
# let another call of the owner start meanwhile, and a turn that found the ring empty (a
# duplicate message of a call another worker took with its place, a message of no agent,
# a ring lost with Redis) has had none (`take_turn`). (A token still in the set, lapsed
# or not, was counted by every take since: moving it lets no call more start, whichever
# Redis process kept it, one back from a snapshot too.) Without the running sets' mark
# nothing is held (-1) until they are counted again (`count_running`), nor taken anew
# without the mark of this Redis process (`_THIS_REDIS`: asked only then, off the common
# path). A place held answers the mark (its generation): the claim that follows commits
# only if Redis still has it (`kept_since_hold`).
_HOLD = (
    _THIS_REDIS
    + """
local generation = redis.pcall('GET', KEYS[2])
if type(generation) ~= 'string' then return -1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  if not this_redis_mark(KEYS[2]) then return -1 end
  local cap = tonumber(ARGV[4])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if cap > 0 and redis.call('ZCARD', KEYS[1]) >= cap then return 0 end
end
redis.call('ZADD', KEYS[1], string.format('%.6f', now + tonumber(ARGV[2])), ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return generation
"""
)
# The places `count_running` counted (KEYS: each call's owner's running set, then the mark;
# ARGV: the sets' expiry, the mark's new generation, then each call's place and its
# lapse), and the mark. A set that holds a turn's place (not a `call:` one) was not lost:
# only the mark was (deleted or evicted alone), and its running calls hold their turns'
# places already (counted again, each held two places until it ended, and an owner below
# the cap was kept at it). Before the mark is set again no turn's place is taken, so
# after a loss every set is empty, or holds only what a count racing this one wrote. A
# mark a racing count set first is kept with its generation: the holds made since it was
# set were made on places Redis still has. A mark of another type than a string (written
# by something else) is no mark: the hold counts again (-1), and the count replaces it
# (once every capped call was left queued for good: no hold could read it). So is a mark
# of another Redis process (`this_redis_mark`): the sets came back from a snapshot (a
# restart that loaded one, a restore, a replica promoted), older than the calls started
# since; every set gets its places then, even one holding turns' places (those of the
# snapshot: each lapses with its lease, or is given back by its turn; too many places
# until then, the safe way), and the mark is replaced.
_COUNTED = (
    _THIS_REDIS
    + """
local mark = KEYS[#KEYS]
local found = redis.pcall('GET', mark)
local restored = type(found) == 'string' and not this_redis_mark(mark)
if type(found) ~= 'string' or restored then redis.call('DEL', mark) end
local kept = {}
for i = 1, #KEYS - 1 do
  local key = KEYS[i]
  if restored then kept[key] = true end
  if kept[key] == nil then
    kept[key] = true
    for _, place in ipairs(redis.call('ZRANGE', key, 0, -1)) do
      if place:sub(1, 5) ~= 'call:' then kept[key] = false break end
    end
  end
  if kept[key] then
    redis.call('ZADD', key, ARGV[2 * i + 2], ARGV[2 * i + 1])
    redis.call('EXPIRE', key, ARGV[1])
  end
end
redis.call('SET', mark, this_redis() .. ':' .. ARGV[2], 'NX')
"""
)
# The running sets' mark (KEYS[1]): its generation, read by a claim (`kept_since_hold`). A
# script rather than a GET: redis-py's own command costs the claim more of its Python.
# (Not whose process it is: a mark an older snapshot brought back is the one the hold
# read only if no count ran since the restore, and every count from then on, started by
# the first take or hold that finds it another process's, waits for this claim's commit.)
_MARK = "return redis.call('GET', KEYS[1])"
# The message of an owed turn: it runs the ring's next call, or nothing (not a call id).
OWED_TURN = "owed-turn"


class Share(NamedTuple):
    """Whose turns a call waits in: its agent's, within its owner's (ids, as text)."""

    owner: str
    agent: str


def _fair_keys(queue: str) -> tuple[str, str]:
    """The ring of owners with calls waiting, and the prefix of each agent's list (and of
    the set of the calls in it: `<list>:in`). Each owner's ring of agents: `_owner_key`.
    (Named apart from the turns per agent's `<queue>:fair:ring` and `:fair:agent:`, so
    that during a rolling upgrade neither reads the other's entries as its own: a call
    listed by the other waits for the reconciler's re-send.)"""
    return f"{queue}:fair:owners", f"{queue}:fair:calls:"


def _owner_key(queue: str, entry: str) -> str:
    return f"{queue}:fair:owner:{entry}"


def _running_key(queue: str, entry: str) -> str:
    """An owner's set of running calls (`_TAKE`): a token per turn, scored with its lapse."""
    return f"{queue}:fair:running:{entry}"


def _owed_key(queue: str) -> str:
    return f"{queue}:fair:owed"


def _counted_key(queue: str) -> str:
    """The running sets' mark: they count every call running on the workers. Set once they
    are counted (`count_running`), with no expiry: only a Redis that lost its data (a
    restart of one that keeps nothing on disk, a flush) is without it, and one back from
    an older snapshot has another process's (`_THIS_REDIS`). Its value is the run_id of
    the Redis process that set it and its generation, new each time it is set again: a
    hold reads it, and its claim commits only if it is the same then (`kept_since_hold`). (Not under `:fair:`, whose keys all go
    when nothing waits or runs.)"""
    return f"{queue}:running-counted"


def _counted_place(call_id: str) -> str:
    """The place `count_running` gives a running call: its worker's turn gives it back."""
    return f"call:{call_id}"


def _running_expiry() -> int:
    """Seconds a running set outlives its last change: past any place's lapse (a lease is
    a tool's timeout plus the grace, and every timeout is below the task's time limit)."""
    return math.ceil(settings.HARNESS_TASK_TIME_LIMIT + settings.HARNESS_LEASE_GRACE) + 1


# --- The cap on one owner's running calls -------------------------------------------------

# A worker holds its process count here (`worker_init`, in its main process before its
# pool forks): the default cap (`running_cap`) leaves one of them for the other owners.
_worker: list[Any] = []


@worker_init.connect  # type: ignore[untyped-decorator]
def _note_worker(sender: Any = None, **kwargs: Any) -> None:
    _worker[:] = [sender]


def running_cap_problem(value: str) -> str | None:
    """What is wrong with a HARNESS_MAX_RUNNING_PER_OWNER value, or None."""
    if value == "auto" or (value.isascii() and value.isdigit()):
        return None
    return (
        f"HARNESS_MAX_RUNNING_PER_OWNER is {value!r}: it must be 'auto' (the worker's "
        "processes minus one) or a whole number of calls (0: no cap)"
    )


def running_cap() -> int:
    """How many calls of one owner may run at once (0: no cap): HARNESS_MAX_RUNNING_PER_OWNER,
    by default (`auto`, and for a value the start-up check refuses) this worker's
    processes minus one, at least one, and no cap in a process that is not a worker."""
    value = settings.HARNESS_MAX_RUNNING_PER_OWNER
    if value != "auto" and running_cap_problem(value) is None:
        return int(value)
    processes = getattr(_worker[0], "concurrency", None) if _worker else None
    return max(1, processes - 1) if isinstance(processes, int) else 0


def _entry(share: Share) -> str:
    """An owner's entry in the ring: its id. An agent of no known owner (a bare agent id
    given) is an owner of its own, under an entry no person's id can be."""
    return share.owner or f"agent:{share.agent}"


def enqueue(call_id: str, agent: Share | str = "", *, resend: bool = False) -> None:
    """Send the worker's message for one call, by task name (no import of the tasks):
    pushed directly where floor.celery_message can (a plain Redis broker), with the call in
    its owner's and agent's turns (above), else send_task (served in order). `agent`: the
    call's `Share` (`agent_of`), or an agent's id alone (its own owner). `resend`: the
    reconciler's (`_RESEND`)."""
    target = celery_message.raw_target(EXECUTE_TASK)
    if target is None:
        current_app.send_task(EXECUTE_TASK, args=(call_id,))
        return
    url, queue = target
    message = celery_message.task_message(EXECUTE_TASK, call_id, queue)
    share = agent if isinstance(agent, Share) else Share("", agent)
    if not share.agent:
        redis_at(url).lpush(queue, message)
        return
    ring, prefix = _fair_keys(queue)
    entry = _entry(share)
    script = _script(url, _RESEND if resend else _PUSH)
    calls = prefix + share.agent
    script(
        keys=[ring, calls, queue, calls + ":in", _owner_key(queue, entry), calls + ":owner"],
        args=[call_id, share.agent, message, entry],
    )


@dataclasses.dataclass
class Turn:
    """What a worker's message runs (`take_turn`): the call (empty: none, the turn is
    owed), and the place its owner holds among running calls while it runs (`running`:
    the owner's set, `slot`: this turn's token; both empty without a cap), on the broker
    at `url` whose `queue` an owed turn's message goes to. A `slot` with no `running` is
    a place still to take, for the call's own owner, at its `hold` (which sets `running`
    when it takes one)."""

    call_id: str
    url: str = ""
    queue: str = ""
    running: str = ""
    slot: str = ""
    claimed: bool = False  # (the worker claimed its call: `end_turn`)
    generation: str = ""  # (the running sets' mark when the place was held: `hold`)
    lost: bool = False  # (Redis lost its data before the claim: `kept_since_hold`)


def take_turn(call_id: str) -> Turn:
    """In a worker, for the message of `call_id`: the call to run now, the next agent's of
    the next owner in the ring whose running calls are below `running_cap`, with its
    place among them (give it back with `end_turn`, however the call ends). No call when
    every owner with calls waiting is at its cap (the turn is owed: see `_TAKE`). The
    message's own call when the ring is empty (a duplicate message of a call taken or
    running, a message pushed without an agent, the ring lost with Redis): a call run
    twice is claimed once, and with a cap its place is taken at its `hold`, below the
    cap or not at all (it ran with none while the worker that took it with its place had
    not claimed it yet, which then gave the place back: one call over the cap). When
    Redis cannot be asked, the message's own call without a cap, and no call with one
    (its owner's running calls cannot be counted: fail closed): it stays queued, and the
    reconciler sends it again."""
    target = celery_message.raw_target(EXECUTE_TASK)
    if target is None:
        return Turn(call_id)
    url, queue = target
    ring, prefix = _fair_keys(queue)
    cap = running_cap()
    token = uuid.uuid4().hex if cap else ""
    keys = [ring, _owed_key(queue), _counted_key(queue)]
    args = [
        prefix,
        _owner_key(queue, ""),
        cap,
        _running_key(queue, ""),
        token,
        settings.HARNESS_LEASE_GRACE,
        _running_expiry(),
    ]
    try:
        turn = _script(url, _TAKE)(keys=keys, args=args)
        if turn == -1:  # (the running sets lost with Redis's data: counted again first)
            count_running(url, queue)
            turn = _script(url, _TAKE)(keys=keys, args=args)
    except (redis.RedisError, DatabaseError):  # (the count's lock not taken in time: as Redis)
        if cap:
            logger.warning(
                "could not take the next turn; running nothing (the running cap cannot be "
                "counted), the reconciler sends call %s again",
                call_id,
                exc_info=True,
            )
            return Turn("")
        logger.warning("could not take the next turn; running the message's call", exc_info=True)
        return Turn(call_id)
    if turn is None:
        return Turn(call_id, url, queue, "", token) if cap else Turn(call_id)
    if turn in (0, -1):
        return Turn("")
    taken, running = (part.decode() for part in turn)
    return Turn(taken, url, queue, running, token) if running else Turn(taken)


def next_turn(call_id: str) -> str:
    """The call `take_turn` gives a worker for the message of `call_id` (without a cap:
    a place taken here would never be given back)."""
    return take_turn(call_id).call_id


class Hold(enum.Enum):
    """What `hold` did: true only when the place is held."""

    HELD = "held"
    AT_CAP = "the owner is at the cap"  # (the call may be sent again now)
    NOT_ASKED = "Redis could not be asked"  # (left to the reconciler)

    def __bool__(self) -> bool:
        return self is Hold.HELD


def hold(turn: Turn, seconds: float, share: Share | None = None) -> Hold:
    """The place of `turn`'s owner lapses `seconds` from now (the call's lease, at its
    claim) instead of at the take's short lapse (a turn without a place has nothing to
    hold). A place no longer held (lapsed, or never taken: the ring was empty) is taken
    anew for the owner (`share`: the call's, needed for a turn that found the ring empty)
    only below the cap (`_HOLD`). Never raises. Anything but HELD: do not claim the call
    (fail closed: a place not held lets one more call of the owner start while it runs);
    it stays queued: AT_CAP, send it again (its turn comes when a place is given back),
    NOT_ASKED, the reconciler sends it again.

    A place taken in another owner's share than the call's (its agent moved to another
    person, `agents.transfer_agent`, while the call was listed in its former owner's
    ring) is given back at once, and one taken anew in the call's owner's: counted as the
    former owner's, the call started beside its new owner's running calls, past their
    cap."""
    if not turn.slot:
        return Hold.HELD
    own = _running_key(turn.queue, _entry(share)) if share is not None else turn.running
    if turn.running and turn.running != own:
        _release(turn, None)
        turn.running, turn.slot = "", uuid.uuid4().hex  # (its own owed message's id)
    seat = not turn.running
    if seat:
        if share is None:
            return Hold.AT_CAP
        turn.running = _running_key(turn.queue, _entry(share))
    held_now = _hold(turn, seconds)
    if held_now is not Hold.HELD and seat:
        turn.running = ""  # (none taken: none to give back)
    return held_now


def _hold(turn: Turn, seconds: float) -> Hold:
    keys = [turn.running, _counted_key(turn.queue)]
    args = [turn.slot, seconds, _running_expiry(), running_cap()]
    try:
        held_now = _script(turn.url, _HOLD)(keys=keys, args=args)
        if held_now == -1:  # (as at the take)
            count_running(turn.url, turn.queue)
            held_now = _script(turn.url, _HOLD)(keys=keys, args=args)
    except (redis.RedisError, DatabaseError):
        logger.warning(
            "could not hold the place of call %s; not running it, the reconciler sends it again",
            turn.call_id,
            exc_info=True,
        )
        return Hold.NOT_ASKED
    if isinstance(held_now, bytes):
        turn.generation = held_now.decode()
        return Hold.HELD
    return Hold.AT_CAP if held_now == 0 else Hold.NOT_ASKED


def kept_since_hold(turn: Turn) -> bool:
    """Whether Redis still has the running places `turn`'s hold counted: its call's claim
    asks, in its transaction, after its conditional update and before its commit
    (transitions.claim's `confirm`). No: the claim is rolled back and the call stays
    queued (`turn.lost`: its worker sends it again).

    A Redis that lost its data (restarted empty, flushed) between a hold and its claim's
    commit lost the place, and the count from the database that followed
    (`count_running`) did not see the call running if it read before the claim committed:
    the owner's next call then started beside it, past the cap. The mark's generation
    (`_counted_key`) says whether that happened before this question: if it did, the mark
    is gone or another; if it happens after, the count waits for this claim's commit (its
    table lock, `_claims_committed`) and counts the call. A Redis back from an older
    snapshot in that moment may bring back the very mark the hold read: the claim commits,
    and the count the next take or hold makes (the mark is another process's:
    `_THIS_REDIS`) waits for it. Redis unreachable: no (fail closed). A turn that held no
    place (no cap) has nothing to lose: yes."""
    if not turn.generation:
        return True
    mark: Any
    try:
        mark = _script(turn.url, _MARK)(keys=[_counted_key(turn.queue)], args=[])
    except redis.RedisError:
        logger.warning(
            "could not read the running places' mark for call %s; not running it, it is sent again",
            turn.call_id,
            exc_info=True,
        )
        mark = None
    else:
        if mark is not None and mark.decode() == turn.generation:
            return True
        logger.warning(
            "Redis lost the running places while call %s was being claimed; not running it, "
            "it is sent again",
            turn.call_id,
        )
    turn.lost = True
    return False


def end_turn(turn: Turn) -> None:
    """`turn`'s place given back, with a message for a turn owed meanwhile (`_RELEASE`):
    kept for this thread's round trip to Redis when one is open
    (redis_clients.one_round_trip: the result's wake-up), else sent now. Never raises: a
    place not given back lapses with the call's lease."""
    if turn.running:
        _release(turn, held(turn.url))


def _release(turn: Turn, trip: Any) -> None:
    """`end_turn`'s give-back, kept for `trip` (a redis_clients round trip) or sent now."""
    queue = turn.queue
    keys = (turn.running, _owed_key(queue), queue, _fair_keys(queue)[0])
    kinds, parts = celery_message.task_message_template(EXECUTE_TASK, OWED_TURN, queue)
    counted = _counted_place(turn.call_id) if turn.claimed else ""
    args = (turn.slot, kinds, *celery_message.lineage(), counted, *parts)
    try:
        if trip is not None:
            trip.add(
                ("EVAL", _RELEASE, "4", *keys, *args), f"the running place of call {turn.call_id}"
            )
        else:
            _script(turn.url, _RELEASE)(keys=list(keys), args=list(args))
    except redis.RedisError:
        logger.warning("could not give back the place of call %s", turn.call_id, exc_info=True)


def count_running(url: str, queue: str) -> None:
    """The running sets counted again from the database, and marked so (`_counted_key`):
    each call running on the workers (not the inline lane's, nor a client's) holds a
    place in its owner's set until its lease ends, given back by the worker's turn that
    claimed it (`end_turn`). Redis lost its data (restarted empty, flushed): every place
    of a call running then was lost, and its owner's next calls started beside it, past
    the cap. The running calls are read once every claim in flight has committed
    (`_claims_committed`): a claim whose place was held before Redis lost it commits only
    if it asked whether Redis still had it before the loss (`kept_since_hold`), and is
    then read here as running; one that asks after is rolled back (the moment between a
    hold and its claim's commit: once a call ran uncounted there). The calls counted are
    read again once their places are written: one that ended meanwhile has its place
    taken back. An owner's set that holds a turn's place was not lost (the mark alone was):
    left as it is (`_COUNTED`). Raises what Redis and the database raise (the lock not
    taken within `_CLAIMS_PATIENCE`: OperationalError)."""
    generation = uuid.uuid4().hex
    with transaction.atomic():
        _claims_committed()
        now = timezone.now()
        rows = list(
            ToolCall.objects.filter(
                status=Status.RUNNING, executor=Executor.HARNESS, lease_until__gt=now
            ).values_list("pk", "session__agent_id", "session__agent__owner_id", "lease_until")
        )
    inline = set(
        AuditEvent.objects.filter(
            kind=kinds.CALL_STARTED,
            actor="inline",
            subject__in=[f"call:{pk}" for pk, *_ in rows],
        ).values_list("subject", flat=True)
    )
    counted, places = dict[uuid.UUID, str](), list[Any]()
    for pk, agent, owner, lease in rows:
        if f"call:{pk}" in inline or lease is None:  # (a lease in the future: never None)
            continue
        counted[pk] = _running_key(queue, _entry(Share(str(owner), str(agent))))
        places += [_counted_place(str(pk)), f"{lease.timestamp():.6f}"]
    _script(url, _COUNTED)(
        keys=[*counted.values(), _counted_key(queue)],
        args=[_running_expiry(), generation, *places],
    )
    # A call that ended between the read and the write gave its place back before it was
    # written (its worker's turn ends after its finish commits): taken back here, or it
    # held its owner's place to its lease's end with nothing running. One still running
    # now gives its place back after this read.
    ended = set(counted) - set(
        ToolCall.objects.filter(pk__in=list(counted), status=Status.RUNNING).values_list(
            "pk", flat=True
        )
    )
    if ended:
        pipe = redis_at(url).pipeline()
        for pk in ended:
            pipe.zrem(counted[pk], _counted_place(str(pk)))
        pipe.execute()
    logger.warning(
        "the running calls' places were not in Redis (restarted or flushed); counted %d "
        "from the database",
        len(rows) - len(inline),
    )


# How long the count waits for the claims in flight (`_claims_committed`): each is one
# transaction of a few statements; a writer stuck longer fails the count (fail closed: no
# turn is taken, the reconciler sends the calls again) rather than hold every other
# writer of calls queued behind the count's lock.
_CLAIMS_PATIENCE = 2.0


def _claims_committed() -> None:
    """In the count's transaction: wait until every transaction writing calls now (a
    claim among them) has committed, and keep new ones out until the count has read. On
    SQLite the transaction's BEGIN IMMEDIATE took the one write lock already; on
    PostgreSQL, the calls' table in SHARE mode (it waits for the writers holding ROW
    EXCLUSIVE, and lets readers on)."""
    db = transaction.get_connection()
    if db.vendor != "postgresql":
        return
    table = db.ops.quote_name(ToolCall._meta.db_table)
    with db.cursor() as cursor:
        cursor.execute(f"SET LOCAL lock_timeout = '{int(_CLAIMS_PATIENCE * 1000)}ms'")
        cursor.execute(f"LOCK TABLE {table} IN SHARE MODE")


@functools.cache
def _script(url: str, text: str) -> Any:
    """`text` on the Redis server at `url` (this process's pool), by its digest with the
    command packed here (redis_clients.Script): called with `keys` and `args`."""
    return functools.partial(Script(text).run, redis_at(url))


def agent_of(call: ToolCall) -> Share:
    """The owner and agent whose turns `call` waits in: from the session and agent loaded
    with the call (admission, the worker), else read (one query, as for the agent alone)."""
    if ToolCall.session.is_cached(call) and AgentSession.agent.is_cached(call.session):
        agent = call.session.agent
        return Share(str(agent.owner_id), str(agent.pk))
    agent_id, owner_id = AgentSession.objects.values_list("agent_id", "agent__owner_id").get(
        pk=call.session_id
    )
    return Share(str(owner_id), str(agent_id))


def enqueue_after_commit(call_id: str, agent: Share, *, resend: bool = False) -> None:
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


def dispatch_ready(batch_id: uuid.UUID, agent: Share | None = None) -> None:
    """Send a Celery message (only the call id) for each call of the batch that may start,
    in the turn of `agent` (the batch's `agent_of`). Without `agent`, the reconciler's
    re-send: the agent and its owner are read and each call is re-sent (`_RESEND`).

    Messages leave after commit, so a worker never receives the id of a call it cannot see
    yet. (Admission marks and sends a new message's runnable calls itself.)
    """
    calls = _UNFINISHED.all(uuid.UUID(str(batch_id)))
    # Only calls no message was sent for: the rows were just read, and the conditional
    # update below still settles a race between two dispatchers.
    ready = [c for c in startable(calls) if c.enqueued_at is None]
    if not ready:
        return
    resend = agent is None
    if agent is None:
        agent_id, owner_id = (
            ToolCall.objects.filter(pk=ready[0].pk)
            .values_list("session__agent_id", "session__agent__owner_id")
            .get()
        )
        agent = Share(str(owner_id), str(agent_id))
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
