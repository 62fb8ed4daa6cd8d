"""rtown2: a rolling upgrade from the turns per agent (2c73cd6: `<queue>:fair:ring` and
`<queue>:fair:agent:<agent id>`). A call an earlier web process listed under those keys,
whose message a new worker took for the ring's next call, runs after the reconciler's
re-send lists it under the new keys, once; nothing new is left behind."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from dispatcher import agents, batches, execution
from dispatcher.models import Status, ToolCall
from floor import celery_message
from floor.redis_clients import redis_at
from tests.battery.live import started_counts
from tests.support.factories import make_agent, submit_one

pytestmark = pytest.mark.django_db


def test_a_call_listed_by_the_previous_version_runs_after_the_resend(
    monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    target = celery_message.raw_target(batches.EXECUTE_TASK)
    assert target is not None, "the test settings' broker is plain Redis"
    url, queue = target[0], f"rtown2-{uuid.uuid4()}"  # a queue no live worker takes from
    monkeypatch.setattr(celery_message, "raw_target", lambda task: (url, queue))
    broker = redis_at(url)
    earlier, later = make_agent(mode="trusted"), make_agent(mode="trusted")
    old = submit_one(agents.start_session(agent=earlier.agent), "run_command", {"argv": ["true"]})
    new = submit_one(agents.start_session(agent=later.agent), "run_command", {"argv": ["true"]})
    assert old.status == new.status == Status.QUEUED
    try:
        # The earlier web process: its agent's list, its ring, its message.
        agent = str(earlier.agent.pk)
        broker.rpush(f"{queue}:fair:agent:{agent}", str(old.pk))
        broker.rpush(f"{queue}:fair:ring", agent)
        broker.lpush(queue, celery_message.task_message(batches.EXECUTE_TASK, str(old.pk), queue))
        batches.enqueue(str(new.pk), batches.agent_of(new))  # the new one
        # A new worker takes the earlier message: the new ring's call runs.
        assert broker.rpop(queue) is not None
        assert batches.next_turn(str(old.pk)) == str(new.pk)
        execution.execute_call(str(new.pk))
        assert ToolCall.objects.get(pk=new.pk).status == Status.COMPLETED
        assert broker.rpop(queue) is not None
        execution.execute_call(batches.next_turn(str(new.pk)))  # its own, claimed already
        assert ToolCall.objects.get(pk=old.pk).status == Status.QUEUED
        # The reconciler: the earlier call waited past HARNESS_REQUEUE_AFTER.
        stale = timezone.now() - timedelta(seconds=settings.HARNESS_REQUEUE_AFTER + 1)
        ToolCall.objects.filter(pk=old.pk).update(queued_at=stale, enqueued_at=stale)
        with django_capture_on_commit_callbacks(execute=True):  # its messages leave
            assert execution.reconcile()["resent"] == 1
        assert broker.rpop(queue) is not None
        execution.execute_call(batches.next_turn("message"))
        assert ToolCall.objects.get(pk=old.pk).status == Status.COMPLETED
        assert started_counts([str(old.pk), str(new.pk)]) == {str(old.pk): 1, str(new.pk): 1}
        assert broker.llen(queue) == 0
        # Only the earlier version's own keys are left (docs/operations.md: deleted after
        # the upgrade; its lists expire in a day).
        assert sorted(k.decode() for k in broker.scan_iter(f"{queue}:*")) == sorted(
            [f"{queue}:fair:agent:{agent}", f"{queue}:fair:ring"]
        )
    finally:
        leftover = list(broker.scan_iter(f"{queue}*"))
        if leftover:
            broker.delete(*leftover)
