"""The worker's "running" wake-up: sent only for a body still running a moment after its
claim (pipeline.RUNNING_NOTICE_AFTER). A call that finishes sooner wakes its session once,
with its result; its claim is in the audit log all the same. (The notice's timing against
the body itself: tests/dispatcher/test_tool_runner.py.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings

from audit.models import AuditEvent
from dispatcher import agents, execution, pipeline, wakeups
from dispatcher.models import Status, ToolCall
from tests.support.factories import make_agent, submit_one


def session_news(pubsub: Any, seconds: float = 0.5) -> list[str]:
    """Every "<call id> <status>" published on the subscribed channel in the next `seconds`."""
    news, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)
        if message is not None:
            news.append(message["data"].decode())
    return news


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_a_quick_call_wakes_its_session_once_a_slow_one_also_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (the quick call under a minute's notice delay, so a loaded machine cannot make its
    # listing outlast it (0.5 s was outlasted at load 12); the slow one under the default's)
    monkeypatch.setattr(pipeline, "RUNNING_NOTICE_AFTER", 60.0)
    fx = make_agent(mode="trusted", workspace=str(tmp_path))
    session = agents.start_session(agent=fx.agent)
    pubsub = redis.Redis.from_url(settings.REDIS_URL).pubsub()
    pubsub.subscribe(wakeups.session_channel(str(session.pk)))
    assert pubsub.get_message(timeout=30)["type"] == "subscribe"  # (its confirmation)
    quick = submit_one(session, "list_directory", {"path": "."}, "quick")
    slow = submit_one(session, "sleep", {"seconds": 0.9}, "slow")
    session_news(pubsub, 0.2)  # (the admissions' own wake-ups)

    execution.execute_call(str(quick.pk))
    assert session_news(pubsub) == [f"{quick.pk} completed"]

    monkeypatch.setattr(pipeline, "RUNNING_NOTICE_AFTER", 0.05)  # (the 0.9 s body outlasts it)
    began = time.monotonic()
    execution.execute_call(str(slow.pk))
    assert time.monotonic() - began >= 0.9
    assert session_news(pubsub) == [f"{slow.pk} running", f"{slow.pk} completed"]
    pubsub.close()

    for call in (quick, slow):
        assert ToolCall.objects.get(pk=call.pk).status == Status.COMPLETED
        kinds = AuditEvent.objects.filter(subject=f"call:{call.pk}").order_by("seq")
        assert [e.kind for e in kinds][-2:] == ["call.started", "call.completed"]
