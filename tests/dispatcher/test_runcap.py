"""One owner's running calls are capped (HARNESS_MAX_RUNNING_PER_OWNER, dispatcher.batches):
turns decided which call a free worker process took next, but nothing bounded how many
calls of one person ran at once, so a person whose calls each ran to their timeout held
every execution process and another person's call waited up to a tool's timeout. Now a
take passes over an owner at its cap (its place in the ring and its calls' order kept),
the turn it could not use is owed and sent again when a place is given back, and a place
of a worker killed running its call lapses with the call's lease."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import run_checks
from django.db import connections

from dispatcher import batches
from dispatcher.models import Status, ToolCall
from floor.redis_clients import redis_at
from tests.battery.live import native, start_session, started_counts, status_counts, wait_terminal
from tests.battery.procs import ProcessGroup, RedisServer, Stack, wait_until
from tests.dispatcher.test_runcap_tools import EXTRA_TOOLS
from tests.support.factories import make_agent

# --- The take, on the run's Redis (no worker) ---------------------------------------------


def take(broker: Any, queue: str) -> batches.Turn:
    """What a worker process does with the next message: takes its turn."""
    assert broker.rpop(queue) is not None, "no message left for a turn"
    return batches.take_turn("message")


def test_an_owner_at_its_cap_is_passed_over_and_its_turns_come_back(
    cap_queue: tuple[Any, str],
) -> None:
    broker, name = cap_queue
    flooder, other = batches.Share("1", str(uuid.uuid4())), batches.Share("2", str(uuid.uuid4()))
    for call in ("a1", "a2", "a3"):
        batches.enqueue(call, flooder)
    batches.enqueue("b1", other)

    first = take(broker, name)
    assert first.call_id == "a1" and first.slot
    # The flooder is at its cap: the other person's call is next, not a2.
    second = take(broker, name)
    assert second.call_id == "b1"
    # Both at their cap: the remaining messages' turns are owed, nothing is run.
    assert take(broker, name) == batches.Turn("")
    assert take(broker, name) == batches.Turn("")
    assert broker.llen(name) == 0

    order = [first.call_id, second.call_id]
    ends = [second, first]  # b1 ends first, then a1
    while ends:
        batches.end_turn(ends.pop(0))  # with a message for a turn owed, if one is
        if broker.llen(name):
            turn = take(broker, name)
            if turn.call_id:
                order.append(turn.call_id)
                ends.append(turn)
    # Every call ran once, the flooder's in their order, one at a time; no turn is left
    # owed and no message is left over.
    assert order == ["a1", "b1", "a2", "a3"]
    assert broker.llen(name) == 0 and not broker.exists(batches._owed_key(name))
    assert not list(broker.scan_iter(f"{name}:fair:calls:*"))
    assert not broker.exists(batches._running_key(name, "1"), batches._running_key(name, "2"))


def test_a_place_never_given_back_lapses(cap_queue: tuple[Any, str]) -> None:
    """A worker killed running a call gives nothing back: its place lapses (`hold`: with
    the call's lease; here a lease already over) and the owner's next call is taken."""
    broker, name = cap_queue
    flooder = batches.Share("1", str(uuid.uuid4()))
    batches.enqueue("a1", flooder)
    batches.enqueue("a2", flooder)
    killed = take(broker, name)
    batches.hold(killed, 30)
    assert take(broker, name) == batches.Turn("")  # a1's place still counts
    batches.hold(killed, 0)  # its lease over
    # Nothing was given back, so no owed turn was sent: the reconciler re-sends a2.
    batches.enqueue("a2", flooder, resend=True)
    assert take(broker, name).call_id == "a2"


def test_outside_a_worker_the_default_is_no_cap(settings: Any) -> None:
    settings.HARNESS_MAX_RUNNING_PER_OWNER = "auto"
    assert batches.running_cap() == 0  # (a worker's: its processes minus one, below)
    settings.HARNESS_MAX_RUNNING_PER_OWNER = "3"
    assert batches.running_cap() == 3


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["lots", "-1", "2.5", "１"])
def test_a_bad_cap_fails_the_start_up_checks(settings: Any, value: str) -> None:
    settings.HARNESS_MAX_RUNNING_PER_OWNER = value
    errors = [e for e in run_checks() if e.id == "dispatcher.E046"]
    assert errors and "HARNESS_MAX_RUNNING_PER_OWNER" in errors[0].msg, errors


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["auto", "0", "3"])
def test_good_caps_pass_the_start_up_checks(settings: Any, value: str) -> None:
    settings.HARNESS_MAX_RUNNING_PER_OWNER = value
    assert not [e for e in run_checks() if e.id == "dispatcher.E046"]


# --- With a real daphne, a Celery worker of two processes and the reconciler -------------

FLOOD = 4  # calls of one person, each in a session of its own, each running until released


@pytest.fixture
def stack(tmp_path: Path, django_db_setup: None, django_db_blocker: Any) -> Iterator[Stack]:
    group = ProcessGroup(tmp_path)
    try:
        with django_db_blocker.unblock():
            # (a grace of 2 s: the place a take holds until the claim lapses after it)
            yield Stack(
                group, RedisServer(group), HARNESS_EXTRA_TOOLS=EXTRA_TOOLS, HARNESS_LEASE_GRACE="2"
            )
            connections.close_all()
    finally:
        group.stop_all()


def send(client: Any, session: str, tool_use_id: str, name: str, args: dict[str, Any]) -> str:
    response = client.post(
        f"/api/v1/sessions/{session}/calls", json=native(tool_use_id, name, args)
    )
    assert response.status_code in (200, 202), response.text[:300]
    return str(response.json()["calls"][0]["id"])


def running(ids: list[str]) -> int:
    return ToolCall.objects.filter(pk__in=ids, status=Status.RUNNING).count()


def live_places(stack: Stack, owner_id: int) -> int:
    """The owner's places among running calls that have not lapsed."""
    broker = redis_at(stack.redis.url)
    key = batches._running_key(stack.env["HARNESS_CELERY_QUEUE"], str(owner_id))
    seconds, micro = broker.time()
    return int(broker.zcount(key, seconds + micro / 1e6, "+inf"))


def place_lapses(stack: Stack, owner_id: int) -> list[float]:
    """When each of the owner's places among running calls lapses (epoch seconds)."""
    key = batches._running_key(stack.env["HARNESS_CELERY_QUEUE"], str(owner_id))
    return [score for _, score in redis_at(stack.redis.url).zrange(key, 0, -1, withscores=True)]


@pytest.mark.live
@pytest.mark.timeout(300)
def test_another_persons_call_runs_while_one_persons_calls_fill_the_worker(stack: Stack) -> None:
    url = stack.daphne()
    stack.worker(2)  # the default cap: one of the two processes left for others
    stack.beat()  # the reconciler: every second, re-sending calls queued 3 s
    flooder, other = make_agent(mode="trusted"), make_agent(mode="trusted")
    with (
        stack.agent_client(url, flooder.headers) as a,
        stack.agent_client(url, other.headers, timeout=60) as b,
    ):
        sessions = [start_session(a) for _ in range(FLOOD)]
        ids = [
            send(a, s["id"], f"w{i}", "runcap_wait_for", {"path": "go"})
            for i, s in enumerate(sessions)
        ]
        wait_until(lambda: running(ids) >= 1, 60, "a call of the flood to run")
        session = start_session(b)["id"]
        began = time.monotonic()
        answer = b.post(
            f"/api/v1/sessions/{session}/calls?wait=15",
            json=native("b", "list_directory", {"path": "."}),
        )
        flood = status_counts(ids)  # as it was when the other person's answer came
        print(f"the other person's call answered in {time.monotonic() - began:.3f}s")
        try:
            assert answer.status_code == 200, answer.text[:300]
            assert answer.json()["calls"][0]["status"] == "completed", answer.text[:300]
            # Before the cap: both processes held the flood's calls, and this call waited
            # for the first of them to end (its tool's timeout).
            assert flood == {Status.RUNNING: 1, Status.QUEUED: FLOOD - 1}, flood
            assert live_places(stack, flooder.owner.pk) == 1
        finally:
            for s in sessions:
                Path(s["workspace"], "go").touch()
    # The cap loses no call: every one of the flood runs, once, one at a time.
    left = wait_terminal(ids, 120)
    assert not left, f"{len(left)} calls unfinished"
    calls = list(ToolCall.objects.filter(pk__in=ids).order_by("started_at"))
    assert {c.status for c in calls} == {Status.COMPLETED}
    assert set(started_counts(ids).values()) == {1}
    for earlier, later in zip(calls, calls[1:], strict=False):
        assert earlier.finished_at is not None and later.started_at is not None
        assert later.started_at >= earlier.finished_at, "two of the flood's calls ran at once"
    assert live_places(stack, flooder.owner.pk) == 0
    assert not list(redis_at(stack.redis.url).scan_iter("*:fair:calls:*"))


@pytest.mark.live
@pytest.mark.timeout(300)
def test_a_killed_workers_place_lapses_with_its_calls_lease(stack: Stack) -> None:
    url = stack.daphne()
    worker = stack.worker(2)
    stack.beat()
    flooder, other = make_agent(mode="trusted"), make_agent(mode="trusted")
    with (
        stack.agent_client(url, flooder.headers) as a,
        stack.agent_client(url, other.headers) as b,
    ):
        killed = send(a, start_session(a)["id"], "k", "runcap_wait_for", {"path": "never"})
        wait_until(lambda: running([killed]) == 1, 60, "the call to run")
        # The place lapses no earlier than the call's lease, however long the claim took
        # after the place was held (it once lapsed 0.55 s early on a loaded SQLite run).
        lease = ToolCall.objects.get(pk=killed).lease_until
        lapses = place_lapses(stack, flooder.owner.pk)
        assert lease is not None and len(lapses) == 1 and lapses[0] >= lease.timestamp()
        worker.kill9()  # its process and pool: nothing given back
        stack.worker(2)
        later = send(a, start_session(a)["id"], "later", "battery_marker", {"path": "m.txt"})
        theirs = send(b, start_session(b)["id"], "theirs", "battery_marker", {"path": "m.txt"})
        left = wait_terminal([killed, later, theirs], 90)
    assert not left, f"{len(left)} calls unfinished"
    dead, mine, another = (ToolCall.objects.get(pk=pk) for pk in (killed, later, theirs))
    assert dead.status == Status.OUTCOME_UNKNOWN
    assert mine.status == another.status == Status.COMPLETED
    # The dead call's place held its owner at the cap until the call's lease ended (the
    # place's own expiry is far later: TASK_TIME_LIMIT + grace), and no longer.
    assert dead.lease_until is not None and mine.started_at is not None
    assert mine.started_at >= dead.lease_until - timedelta(seconds=0.5)
    assert live_places(stack, flooder.owner.pk) == 0
