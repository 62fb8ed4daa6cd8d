"""rtcap3: the running cap counts each owner's running calls in Redis only. A Redis that
restarted empty (the embedded one keeps nothing on disk) or was flushed while a call ran
forgot its place: the owner's next call found no place taken and started beside it, two
of one person's calls at once under a cap of one, until the first ended. Now the sets are
marked as counting every running call; a take or hold finding the mark gone counts the
calls the database has running on the workers first, and the worker that runs one of
those gives its place back when it ends."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from dispatcher import agents, batches, execution
from dispatcher.models import Status, ToolCall
from floor import celery_message
from floor.redis_clients import redis_at
from tests.battery.procs import ProcessGroup, RedisServer, wait_until
from tests.support.factories import make_agent, submit_one


@pytest.fixture
def lane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> Iterator[tuple[RedisServer, str]]:
    """The execution lane on a Redis of the test's own (one it can restart), a cap of one
    running call per owner, and a tool whose call runs until the test lets it end."""
    group = ProcessGroup(tmp_path)
    try:
        server = RedisServer(group)
        name = f"rtcap3-{uuid.uuid4()}"
        monkeypatch.setattr(celery_message, "raw_target", lambda task: (server.url, name))
        settings.HARNESS_MAX_RUNNING_PER_OWNER = "1"
        settings.HARNESS_TOOLS = [
            *settings.HARNESS_TOOLS,
            "tests.dispatcher.test_runcap_tools.WAIT_FOR",
        ]
        yield server, name
    finally:
        group.stop_all()


def status(call: ToolCall) -> str:
    return str(ToolCall.objects.get(pk=call.pk).status)


def live_places(broker: Any, queue: str, owner: int) -> int:
    seconds, micro = broker.time()
    key = batches._running_key(queue, str(owner))
    return int(broker.zcount(key, seconds + micro / 1e6, "+inf"))


def worker(target: Callable[[], None]) -> threading.Thread:
    """A worker process's thread (its own database connection, closed when it ends)."""

    def run() -> None:
        try:
            target()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("seat", [False, True])
def test_redis_restarted_while_a_call_runs_starts_no_other_call_of_its_owner(
    lane: tuple[RedisServer, str], seat: bool
) -> None:
    """`seat`: the owner's next call comes by a message that finds the ring empty (its
    place is taken at its hold), not by its take."""
    server, queue = lane
    broker = redis_at(server.url)
    fx = make_agent(mode="trusted")
    first_session = agents.start_session(agent=fx.agent)
    long = submit_one(first_session, "runcap_wait_for", {"path": "go"})
    assert broker.rpop(queue) is not None  # (its message, sent after commit)
    thread = worker(lambda: execution.execute_turn(str(long.pk)))
    try:
        wait_until(lambda: status(long) == Status.RUNNING, 30, "the first call to run")
        server.kill9()
        server.start()  # empty: every place forgotten
        later = submit_one(agents.start_session(agent=fx.agent), "list_directory", {"path": "."})
        assert broker.rpop(queue) is not None
        if seat:
            broker.delete(batches._fair_keys(queue)[0])
        execution.execute_turn(str(later.pk))
        # Before: the owner's next call ran at once, beside the first.
        assert status(later) == Status.QUEUED
        assert status(long) == Status.RUNNING
    finally:
        Path(first_session.workspace, "go").touch()
        thread.join(30)
    assert not thread.is_alive()
    # Not held back for good: the first call's place is given back when it ends.
    assert live_places(broker, queue, fx.owner.pk) == 0
    while broker.rpop(queue) is not None:
        execution.execute_turn(str(later.pk))
    for call in (long, later):
        row = ToolCall.objects.get(pk=call.pk)
        assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    assert live_places(broker, queue, fx.owner.pk) == 0
