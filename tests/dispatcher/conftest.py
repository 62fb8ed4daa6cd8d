"""Fixtures of the running cap's tests (test_runcap*.py, test_rtcap*.py): an execution
lane of the test's own, with a cap of one running call per owner. Their helpers are in
tests/support/running_cap.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher import batches
from floor import celery_message
from floor.redis_clients import redis_at
from tests.battery.procs import ProcessGroup, RedisServer
from tests.support.running_cap import mark_counted

# A tool whose call runs until the test lets it end (a file appears in its workspace).
WAIT_FOR = "tests.dispatcher.test_runcap_tools.WAIT_FOR"


def _lane_on_run_redis(
    monkeypatch: pytest.MonkeyPatch, settings: Any, prefix: str
) -> Iterator[tuple[Any, str]]:
    target = celery_message.raw_target(batches.EXECUTE_TASK)
    assert target is not None, "the test settings' broker is plain Redis"
    url, name = target[0], f"{prefix}-{uuid.uuid4()}"
    monkeypatch.setattr(celery_message, "raw_target", lambda task: (url, name))
    settings.HARNESS_MAX_RUNNING_PER_OWNER = "1"
    broker = redis_at(url)
    mark_counted(broker, name)  # (a queue of its own: nothing runs yet)
    yield broker, name
    leftover = list(broker.scan_iter(f"{name}*"))
    if leftover:
        broker.delete(*leftover)


@pytest.fixture
def cap_queue(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[tuple[Any, str]]:
    """The run's broker and a queue of the test's own (no live worker takes from it), with
    a cap of one running call per owner: (the broker's client, the queue's name)."""
    yield from _lane_on_run_redis(monkeypatch, settings, "runcap")


@pytest.fixture
def cap_lane(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[tuple[Any, str]]:
    """`cap_queue`, and a tool whose call runs until the test lets it end
    (`runcap_wait_for`: until the file `path` appears in its workspace)."""
    settings.HARNESS_TOOLS = [*settings.HARNESS_TOOLS, WAIT_FOR]
    yield from _lane_on_run_redis(monkeypatch, settings, "rtcap")


@pytest.fixture
def own_cap_lane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> Iterator[tuple[RedisServer, str]]:
    """The execution lane on a Redis of the test's own (one it can restart or flush), a
    cap of one running call per owner, and `runcap_wait_for`: (the server, the queue's
    name). Its running places are not counted yet (no mark: the first take counts)."""
    group = ProcessGroup(tmp_path)
    try:
        server = RedisServer(group)
        name = f"rtcap3-{uuid.uuid4()}"
        monkeypatch.setattr(celery_message, "raw_target", lambda task: (server.url, name))
        settings.HARNESS_MAX_RUNNING_PER_OWNER = "1"
        settings.HARNESS_TOOLS = [*settings.HARNESS_TOOLS, WAIT_FOR]
        yield server, name
    finally:
        group.stop_all()
