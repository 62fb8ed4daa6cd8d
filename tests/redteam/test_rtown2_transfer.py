"""rtown2: an agent moved to another owner (`agents.transfer_agent`) while it had calls
queued kept its place in its former owner's ring of agents: its list never emptied while
it kept sending, so every later call of it waited in the former owner's share, one turn
among all of that person's agents, and never in its new owner's (a person flooding with
ten agents held the moved agent's calls behind ten of theirs each round). A re-send or a
busy workspace's give-back of one of its calls then put it in the new owner's ring as
well: one agent, a turn in two people's shares."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User

from dispatcher import agents, batches
from floor.redis_clients import redis_at
from tests.battery.live import start_session, started_counts, wait_terminal
from tests.battery.procs import Stack, wait_until
from tests.redteam.test_rtown_queue import queue, send, stack, take_all, timed
from tests.support.factories import make_agent, make_user, unique

__all__ = ["queue", "stack"]

FLOOD = 10  # agents of the former owner, each with 3 calls queued


def test_a_moved_agents_later_calls_wait_in_its_new_owners_turns(queue: tuple[Any, str]) -> None:
    broker, name = queue
    former, new = "11", "12"  # two people's ids
    fleet = [str(uuid.uuid4()) for _ in range(FLOOD)]
    moved = str(uuid.uuid4())
    batches.enqueue("m0", batches.Share(former, moved))  # queued before the move
    for i in range(3):
        for agent in fleet:
            batches.enqueue(f"{agent}/{i}", batches.Share(former, agent))
    # The move: from now on the agent's calls are its new owner's (agent_of reads it).
    later = [f"m{i}" for i in range(1, 4)]
    for call in later:
        batches.enqueue(call, batches.Share(new, moved))
    turns = take_all(broker, name)
    mine = [t for t in turns if t.startswith("m")]
    assert sorted(set(mine)) == ["m0", "m1", "m2", "m3"], turns
    # The new owner is the only other person with calls queued: the moved agent's later
    # calls each wait for at most one call of the former owner's, not one of each of its
    # agents.
    firsts = [turns.index(c) for c in later]
    assert firsts[-1] <= 2 * len(later) + 2, (firsts, turns[:20])
    # Its calls kept their order, the one queued before the move first.
    assert mine == ["m0", *later], mine
    assert not list(broker.scan_iter(f"{name}:fair:*"))


def test_a_moved_agent_holds_a_turn_in_one_owners_share(queue: tuple[Any, str]) -> None:
    """Moved, and one of its calls re-sent (the reconciler, or a busy workspace's
    give-back): its turns are its new owner's only, one a round."""
    broker, name = queue
    former, new, third = "21", "22", "23"
    moved, lone = str(uuid.uuid4()), str(uuid.uuid4())
    batches.enqueue("m0", batches.Share(former, moved))
    later = [f"m{i}" for i in range(1, 9)]
    for call in later:
        batches.enqueue(call, batches.Share(new, moved))
    batches.enqueue("m0", batches.Share(new, moved), resend=True)  # its message was late
    theirs = [f"{lone}/{i}" for i in range(4)]
    for call in theirs:
        batches.enqueue(call, batches.Share(third, lone))
    turns = take_all(broker, name)
    # Another person's calls wait for one call of the moved agent each, not two.
    assert [turns.index(c) for c in theirs] == [1, 3, 5, 7], turns
    assert not list(broker.scan_iter(f"{name}:fair:*"))


def test_moved_back_and_lists_of_the_previous_version(queue: tuple[Any, str]) -> None:
    """Moved away and back with calls queued: one place, in its owner's ring. A list the
    previous version made (no recorded owner: a rolling upgrade) is taken where found."""
    broker, name = queue
    ring, prefix = batches._fair_keys(name)
    first, second, lone, earlier = "31", "32", str(uuid.uuid4()), str(uuid.uuid4())
    moved = str(uuid.uuid4())
    batches.enqueue("m0", batches.Share(first, moved))
    batches.enqueue("m1", batches.Share(second, moved))
    batches.enqueue("m2", batches.Share(first, moved))
    batches.enqueue("m3", batches.Share(first, moved))
    for i in range(3):
        batches.enqueue(f"{lone}/{i}", batches.Share("33", lone))
    # As 546ea51 listed a call: its list, its owner's ring, the ring of owners; no owner key.
    broker.rpush(prefix + earlier, "e0")
    broker.sadd(prefix + earlier + ":in", "e0")
    broker.rpush(batches._owner_key(name, "34"), earlier)
    broker.rpush(ring, "34")
    broker.lpush(name, "message")
    turns = take_all(broker, name)
    assert [t for t in turns if t.startswith("m")] == ["m0", "m1", "m2", "m3"], turns
    assert [turns.index(f"{lone}/{i}") for i in range(3)] == [1, 4, 6], turns
    assert "e0" in turns
    assert not list(broker.scan_iter(f"{name}:fair:*"))


# --- With a real daphne and Celery worker ------------------------------------------------

FLEET = 12  # agents of the former owner
FLEET_CALLS = 3  # each, one a session
SLOW = 1.0
WORKERS = 4


@pytest.mark.live
@pytest.mark.timeout(300)
def test_a_moved_agents_call_is_not_held_in_its_former_owners_turns(stack: Stack) -> None:
    url = stack.daphne()
    stack.worker(WORKERS)
    # (No reconciler: its re-send of the moved agent's waiting call gave the agent a second
    # place, in its new owner's ring, as well as the one in its former owner's.)
    former: User = make_user(unique("former"), mode="trusted")
    fleet = [make_agent(mode="trusted", owner=former) for _ in range(FLEET)]
    moved = make_agent(mode="trusted", owner=former)
    clients = [stack.agent_client(url, fx.headers, timeout=60) for fx in fleet]
    with stack.agent_client(url, moved.headers, timeout=70) as mover:
        idle = max(timed(mover, f"idle{i}") for i in range(3))
        sessions = [[start_session(c)["id"] for _ in range(FLEET_CALLS)] for c in clients]
        waiting = start_session(mover)["id"]
        ids = []
        for k in range(FLEET_CALLS):
            for n, client in enumerate(clients):
                ids.append(send(client, sessions[n][k], f"f{n}-{k}", SLOW))
        ids.append(send(mover, waiting, "before", SLOW))  # queued under the former owner
        new_owner: User = make_user(unique("new"), mode="trusted")
        assert agents.transfer_agent(agent=moved.agent, actor="test", owner=new_owner)
        moved_after = timed(mover, "after")
    for client in clients:
        client.close()
    left = wait_terminal(ids, 120)
    print(f"idle {idle:.3f}s moved agent's call {moved_after:.3f}s")
    assert not left, f"{len(left)} calls unfinished"
    assert set(started_counts(ids).values()) == {1}
    queue = stack.env["HARNESS_CELERY_QUEUE"]
    broker = redis_at(stack.redis.url)
    wait_until(lambda: broker.llen(queue) == 0, 30, "the queue to drain")
    assert not list(broker.scan_iter(f"{queue}:fair:*"))
    # Its new owner has no other calls queued: its call waits for the calls running, its
    # own earlier call and one of the former owner's, not one of each of the former
    # owner's agents (FLEET * 2 calls of SLOW seconds on WORKERS processes: 6 s).
    assert moved_after < idle + 2 * SLOW + 1.0, (idle, moved_after)
