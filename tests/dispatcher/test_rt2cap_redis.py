"""rt2cap: a call whose hold found its owner at the cap (Hold.AT_CAP) is sent again at once
(execution._send_again). When Redis went away between the hold's answer and that
message, the worker's task failed with Redis's error (logged by Celery at ERROR, with its
traceback), unlike every other Redis step of the worker's path, which logs a warning and
leaves the call to the reconciler. Now it is left to the reconciler too, and runs once
when Redis answers again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from dispatcher import agents, batches, execution
from dispatcher.models import Status, ToolCall
from floor import celery_message
from floor.redis_clients import redis_at
from tests.battery.procs import ProcessGroup, RedisServer, wait_until
from tests.support.factories import make_agent, submit_one

pytestmark = pytest.mark.django_db


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    group = ProcessGroup(tmp_path)
    try:
        yield RedisServer(group)
    finally:
        group.stop_all()


def live_places(broker: Any, queue: str, owner: int) -> int:
    seconds, micro = broker.time()
    key = batches._running_key(queue, str(owner))
    return int(broker.zcount(key, seconds + micro / 1e6, "+inf"))


def test_redis_gone_when_a_call_at_the_cap_is_sent_again_leaves_it_to_the_reconciler(
    redis_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    queue = f"rt2cap-{uuid.uuid4()}"
    monkeypatch.setattr(celery_message, "raw_target", lambda task: (redis_server.url, queue))
    settings.HARNESS_MAX_RUNNING_PER_OWNER = "1"
    broker = redis_at(redis_server.url)
    fx = make_agent(mode="trusted")
    calls = []
    for _ in range(2):
        call = submit_one(agents.start_session(agent=fx.agent), "list_directory", {"path": "."})
        batches.enqueue(str(call.pk), batches.agent_of(call))  # (admission's, after commit)
        calls.append(call)
    # The first call's take: its place lapses before its hold, and the owner's next call
    # takes the place meanwhile.
    settings.HARNESS_LEASE_GRACE = 0.05
    assert broker.rpop(queue) is not None
    slow = batches.take_turn("message")
    assert slow.call_id == str(calls[0].pk)
    wait_until(lambda: live_places(broker, queue, fx.owner.pk) == 0, 5, "the place to lapse")
    settings.HARNESS_LEASE_GRACE = 1.0
    assert broker.rpop(queue) is not None
    quick = batches.take_turn("message")
    assert quick.call_id == str(calls[1].pk) and batches.hold(quick, 30)
    # Redis goes away as the first call's hold answers that its owner is at the cap.
    real_hold = batches.hold
    answers: list[batches.Hold] = []

    def hold_then_redis_gone(*args: Any, **kwargs: Any) -> batches.Hold:
        answers.append(real_hold(*args, **kwargs))
        redis_server.kill9()
        return answers[-1]

    monkeypatch.setattr(batches, "hold", hold_then_redis_gone)
    # Before: redis.ConnectionError out of the worker's task.
    try:
        execution.execute_call(slow.call_id, turn=slow)
    finally:
        batches.end_turn(slow)
    assert answers == [batches.Hold.AT_CAP]
    row = ToolCall.objects.get(pk=calls[0].pk)
    assert row.status == Status.QUEUED and row.attempts == 0
    # Not lost: Redis back (empty), the reconciler sends it again once it has waited.
    monkeypatch.setattr(batches, "hold", real_hold)
    redis_server.start()
    stale = timezone.now() - timedelta(seconds=django_settings.HARNESS_REQUEUE_AFTER + 1)
    ToolCall.objects.filter(pk=calls[0].pk).update(queued_at=stale, enqueued_at=stale)
    with django_capture_on_commit_callbacks(execute=True):
        assert execution.reconcile()["resent"] == 1
    assert broker.rpop(queue) is not None
    execution.execute_turn("message")
    row = ToolCall.objects.get(pk=calls[0].pk)
    assert (row.status, row.attempts) == (Status.COMPLETED, 1)
