"""rt2cap4: red team of the claim's confirm (batches.kept_since_hold, transitions.claim's
`confirm`) and the count's table lock (batches._claims_committed), on a Redis of the
test's own: a claim rolled back is never lost, run twice or left queued for good, a
flapping Redis does not keep every claim failing, a writer that holds the calls' table
fails the count closed (no turn) within its patience rather than stalling the lane."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import transaction

from audit import kinds
from audit.models import AuditEvent
from dispatcher import agents, batches, execution
from dispatcher.models import Status, ToolCall
from floor.redis_clients import redis_at
from tests.battery.procs import RedisServer
from tests.dispatcher.conftest import own_cap_lane  # noqa: F401 (the fixture)
from tests.support.factories import make_agent, submit_one
from tests.support.running_cap import live_places, status, worker

POSTGRES = "postgresql" in django_settings.DATABASES["default"]["ENGINE"]


def starts(call: ToolCall) -> int:
    """The call's claims recorded (one per time it started)."""
    return AuditEvent.objects.filter(kind=kinds.CALL_STARTED, session_id=call.session_id).count()


def drain(broker: Any, queue: str, call: ToolCall, rounds: int = 20) -> None:
    """Every message of the lane taken by a worker, as a worker process would."""
    for _ in range(rounds):
        if broker.rpop(queue) is None:
            return
        execution.execute_turn(str(call.pk))


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_redis_gone_at_the_confirm_rolls_the_claim_back_and_the_call_runs_once_later(
    own_cap_lane: tuple[RedisServer, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    server, queue = own_cap_lane
    broker = redis_at(server.url)
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    call = submit_one(session, "runcap_wait_for", {"path": "go"})
    Path(session.workspace, "go").touch()  # (it ends as soon as it runs)
    assert broker.rpop(queue) is not None
    real = batches.kept_since_hold
    asked: list[bool] = []

    def confirm(turn: batches.Turn) -> bool:
        server.kill9()  # Redis goes away between the hold and the claim's commit
        asked.append(True)
        return real(turn)

    monkeypatch.setattr(batches, "kept_since_hold", confirm)
    execution.execute_turn(str(call.pk))  # (its re-send and give-back fail: logged)
    assert asked
    assert status(call) == Status.QUEUED  # rolled back: fail closed
    assert starts(call) == 0
    assert ToolCall.objects.get(pk=call.pk).attempts == 0
    monkeypatch.setattr(batches, "kept_since_hold", real)
    server.start()  # (restarted empty)
    settings.HARNESS_REQUEUE_AFTER = 0
    execution.reconcile()  # not stuck: the reconciler sends it again
    drain(broker, queue, call)
    assert status(call) == Status.COMPLETED
    assert starts(call) == 1
    assert ToolCall.objects.get(pk=call.pk).attempts == 1
    assert live_places(broker, queue, fx.owner.pk) == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_worker_dead_right_after_the_rollback_leaves_the_call_to_the_reconciler(
    own_cap_lane: tuple[RedisServer, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    server, queue = own_cap_lane
    broker = redis_at(server.url)
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    call = submit_one(session, "runcap_wait_for", {"path": "go"})
    Path(session.workspace, "go").touch()
    assert broker.rpop(queue) is not None
    real = batches.kept_since_hold

    def confirm(turn: batches.Turn) -> bool:
        broker.flushall()
        return real(turn)

    class Died(BaseException):
        pass

    def die(call: ToolCall) -> None:
        raise Died  # the worker killed after the rollback, before its re-send

    send_again = execution._send_again
    monkeypatch.setattr(batches, "kept_since_hold", confirm)
    monkeypatch.setattr(execution, "_send_again", die)
    with pytest.raises(Died):
        execution.execute_turn(str(call.pk))
    assert status(call) == Status.QUEUED
    monkeypatch.setattr(batches, "kept_since_hold", real)
    monkeypatch.setattr(execution, "_send_again", send_again)
    assert broker.llen(queue) == 0  # (no message: only the reconciler sends it now)
    settings.HARNESS_REQUEUE_AFTER = 0
    execution.reconcile()
    drain(broker, queue, call)
    assert status(call) == Status.COMPLETED
    assert starts(call) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_flapping_redis_fails_claims_only_while_it_flaps(
    own_cap_lane: tuple[RedisServer, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, queue = own_cap_lane
    broker = redis_at(server.url)
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    call = submit_one(session, "runcap_wait_for", {"path": "go"})
    Path(session.workspace, "go").touch()
    real = batches.kept_since_hold
    flaps = [5]

    def confirm(turn: batches.Turn) -> bool:
        if flaps[0]:
            flaps[0] -= 1
            broker.flushall()  # Redis loses its data at the worst moment, again and again
        return real(turn)

    monkeypatch.setattr(batches, "kept_since_hold", confirm)
    drain(broker, queue, call)  # each rollback sends the call again at once
    assert flaps[0] == 0
    assert status(call) == Status.COMPLETED
    assert starts(call) == 1
    assert live_places(broker, queue, fx.owner.pk) == 0


@pytest.mark.skipif(not POSTGRES, reason="the calls' table lock is PostgreSQL's")
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_writer_holding_the_calls_table_fails_the_count_closed_and_admission_goes_on(
    own_cap_lane: tuple[RedisServer, str],  # noqa: F811
    settings: Any,
) -> None:
    server, queue = own_cap_lane
    broker = redis_at(server.url)
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    other = agents.start_session(agent=fx.agent)
    call = submit_one(session, "runcap_wait_for", {"path": "go"})
    Path(session.workspace, "go").touch()
    Path(other.workspace, "go").touch()
    assert broker.rpop(queue) is not None
    # A writer that holds ROW EXCLUSIVE on the calls' table (a long transaction).
    holding, release = threading.Event(), threading.Event()

    def writer() -> None:
        with transaction.atomic():
            ToolCall.objects.filter(pk=call.pk).update(enqueued_at=None)
            holding.set()
            release.wait(60)

    held = worker(writer)
    assert holding.wait(30)
    try:
        broker.delete(batches._counted_key(queue))  # the mark lost: the next take counts
        began = time.monotonic()
        turn = batches.take_turn(str(call.pk))
        waited = time.monotonic() - began
        assert turn.call_id == ""  # fail closed: no turn taken while it cannot count
        assert waited < batches._CLAIMS_PATIENCE + 3
        # Writers queued behind the count's lock went on once it gave up.
        began = time.monotonic()
        submit_one(other, "runcap_wait_for", {"path": "go"}, tool_use_id="x")
        assert time.monotonic() - began < batches._CLAIMS_PATIENCE + 3
    finally:
        release.set()
        held.join(30)
    # Once the writer committed, the next take counts and both calls run, once each.
    settings.HARNESS_REQUEUE_AFTER = 0
    execution.reconcile()
    drain(broker, queue, call)
    assert status(call) == Status.COMPLETED
    assert ToolCall.objects.filter(session=other, status=Status.COMPLETED).count() == 1
    assert starts(call) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_scripts_lost_but_data_kept_at_the_confirm_still_claim(
    own_cap_lane: tuple[RedisServer, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Redis that forgot its scripts (SCRIPT FLUSH, a failover to a replica that kept the
    data) between the hold and the confirm: the confirm's EVALSHA is answered NOSCRIPT,
    sent again as EVAL, and the claim, whose place Redis still has, commits."""
    server, queue = own_cap_lane
    broker = redis_at(server.url)
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    call = submit_one(session, "runcap_wait_for", {"path": "go"})
    Path(session.workspace, "go").touch()
    real = batches.kept_since_hold
    answers: list[bool] = []

    def confirm(turn: batches.Turn) -> bool:
        broker.script_flush()
        answers.append(real(turn))
        return answers[-1]

    monkeypatch.setattr(batches, "kept_since_hold", confirm)
    drain(broker, queue, call)
    assert answers == [True]
    assert status(call) == Status.COMPLETED
    assert starts(call) == 1
    assert live_places(broker, queue, fx.owner.pk) == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_hung_redis_at_the_confirm_fails_the_claim_closed_within_its_timeout(
    own_cap_lane: tuple[RedisServer, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    """Redis stops answering (SIGSTOP: connections accepted, nothing read) while a claim
    confirms: the claim's transaction, which holds the call's row and its session's
    audit chain, gives up within the client's timeout, and the call runs once Redis is
    back and the place its hold took has lapsed."""
    import os
    import signal

    server, queue = own_cap_lane
    broker = redis_at(server.url)
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    call = submit_one(session, "runcap_wait_for", {"path": "go"})
    Path(session.workspace, "go").touch()
    assert broker.rpop(queue) is not None
    real = batches.kept_since_hold
    took: list[float] = []
    assert server.proc is not None
    pid = server.proc.pid

    def confirm(turn: batches.Turn) -> bool:
        os.kill(pid, signal.SIGSTOP)
        began = time.monotonic()
        try:
            return real(turn)
        finally:
            took.append(time.monotonic() - began)

    monkeypatch.setattr(batches, "kept_since_hold", confirm)
    try:
        execution.execute_turn(str(call.pk))
    finally:
        os.kill(pid, signal.SIGCONT)
    # The client's 2 s timeout with 8 s of room for a loaded host: a confirm without one is
    # held until Redis answers (never here, until SIGCONT), five of them in a row 10 s.
    assert took and took[0] < 10, took
    assert status(call) == Status.QUEUED
    assert starts(call) == 0
    monkeypatch.setattr(batches, "kept_since_hold", real)
    # (Known, kept: the hold's place, whose give-back Redis did not answer either, holds
    # the owner's place until it lapses with the lease the call never had: fail closed,
    # as any give-back lost is. Its lapse is the test's to wait for, not the reconciler's.)
    assert live_places(broker, queue, fx.owner.pk) == 1
    broker.delete(batches._running_key(queue, str(fx.owner.pk)))
    settings.HARNESS_REQUEUE_AFTER = 0
    execution.reconcile()
    drain(broker, queue, call)
    assert status(call) == Status.COMPLETED
    assert starts(call) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_redis_out_of_memory_at_the_hold_runs_nothing_and_the_call_runs_once_later(
    own_cap_lane: tuple[RedisServer, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> None:
    """Redis at its maxmemory (noeviction) when the place is held: the hold's write is
    refused, nothing is claimed, and once memory is back the call runs, once."""
    server, queue = own_cap_lane
    broker = redis_at(server.url)
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    call = submit_one(session, "runcap_wait_for", {"path": "go"})
    Path(session.workspace, "go").touch()
    assert broker.rpop(queue) is not None
    real = batches._hold
    holds: list[batches.Hold] = []

    def hold(turn: batches.Turn, seconds: float) -> batches.Hold:
        broker.config_set("maxmemory", "1")
        try:
            holds.append(real(turn, seconds))
        finally:
            broker.config_set("maxmemory", "0")
        return holds[-1]

    monkeypatch.setattr(batches, "_hold", hold)
    execution.execute_turn(str(call.pk))
    assert holds == [batches.Hold.NOT_ASKED]
    assert status(call) == Status.QUEUED
    assert starts(call) == 0
    assert live_places(broker, queue, fx.owner.pk) == 0  # (the take's, given back)
    monkeypatch.setattr(batches, "_hold", real)
    settings.HARNESS_REQUEUE_AFTER = 0
    execution.reconcile()
    drain(broker, queue, call)
    assert status(call) == Status.COMPLETED
    assert starts(call) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_mark_of_another_type_is_counted_again_not_every_call_left_queued(
    own_cap_lane: tuple[RedisServer, str],  # noqa: F811
    settings: Any,
) -> None:
    """The running sets' mark written as another type than a string (by something else on
    the same Redis): the hold, which reads its generation, once failed on it every time
    (WRONGTYPE: NOT_ASKED), and every capped call stayed queued for good, re-sent by the
    reconciler round after round. Now it is no mark: counted again, and replaced."""
    server, queue = own_cap_lane
    broker = redis_at(server.url)
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    call = submit_one(session, "runcap_wait_for", {"path": "go"})
    Path(session.workspace, "go").touch()
    mark = batches._counted_key(queue)
    broker.delete(mark)
    broker.rpush(mark, "not a generation")
    drain(broker, queue, call)
    settings.HARNESS_REQUEUE_AFTER = 0
    for _ in range(2):  # (before: the reconciler's rounds changed nothing)
        if status(call) != Status.QUEUED:
            break
        execution.reconcile()
        drain(broker, queue, call)
    assert status(call) == Status.COMPLETED
    assert starts(call) == 1
    assert broker.type(mark) == b"string"
    assert live_places(broker, queue, fx.owner.pk) == 0
