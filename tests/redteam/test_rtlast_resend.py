"""rtlast: a call a worker gave back to its agent's turn because another call of its
session held the workspace (dispatcher.execution `_workspace_lock`) was sent a message
again, but its `enqueued_at` still said when admission sent the first. So the reconciler
took it for lost every HARNESS_REQUEUE_AFTER and sent one more message, and each of them
found the lock held and sent itself again: behind one command of a long timeout, every
call waiting for it gathered one more message every 30 s, each taking a worker for a
second at a time until the command ended."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from dispatcher import agents, batches, execution
from dispatcher.models import Status, ToolCall
from dispatcher.tools import workspace_lock
from floor import celery_message
from floor.redis_clients import redis_at
from tests.support.factories import make_agent, submit_one

pytestmark = pytest.mark.django_db


def test_a_call_given_back_for_its_workspace_is_not_resent_by_the_reconciler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = celery_message.raw_target(batches.EXECUTE_TASK)
    assert target is not None, "the test settings' broker is plain Redis"
    url, queue = target[0], f"rtlast-{uuid.uuid4()}"  # a queue no live worker takes from
    monkeypatch.setattr(celery_message, "raw_target", lambda task: (url, queue))
    monkeypatch.setattr(execution, "_LOCK_PATIENCE", 0.1)
    broker = redis_at(url)
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    call = submit_one(session, "run_command", {"argv": ["true"]})
    assert call.status == Status.QUEUED
    # It has waited longer than the reconciler's patience, given back each time.
    stale = timezone.now() - timedelta(seconds=settings.HARNESS_REQUEUE_AFTER + 1)
    ToolCall.objects.filter(pk=call.pk).update(queued_at=stale, enqueued_at=stale)
    ring, prefix = batches._fair_keys(queue)
    agent = str(fx.agent.pk)
    try:
        with workspace_lock.held(Path(session.workspace)):  # another command runs
            execution.execute_call(str(call.pk))  # given back: one message sent now
            assert broker.llen(queue) == 1
            assert execution.reconcile()["resent"] == 0
            assert broker.llen(queue) == 1  # not a second message for the same call
        assert ToolCall.objects.get(pk=call.pk).status == Status.QUEUED
        assert batches.next_turn("message") == str(call.pk)  # still in its turn, once
        execution.execute_call(str(call.pk))  # the lock is free: it runs
        assert ToolCall.objects.get(pk=call.pk).status == Status.COMPLETED
    finally:
        broker.delete(queue, ring, prefix + agent, prefix + agent + ":in")
