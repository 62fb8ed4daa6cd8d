"""A wake-up that cannot be published never fails what was committed: any failure of the
Redis client in publish_change (seen under load: ValueError from redis-py's connect) is
logged, and the change's other receivers still run."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher import signals, wakeups


class BrokenClient:
    def publish(self, *args: Any) -> None:
        raise ValueError("I/O operation on closed file.")


def test_a_client_failure_is_logged_and_the_signal_still_sent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(wakeups, "redis_at", lambda url: BrokenClient())
    seen: list[str] = []

    def receiver(sender: Any, call_id: str, **kwargs: Any) -> None:
        seen.append(call_id)

    signals.call_changed.connect(receiver, dispatch_uid="test-publish-failure")
    try:
        wakeups.publish_change("c-1", "s-1", "completed", "running")  # does not raise
    finally:
        signals.call_changed.disconnect(dispatch_uid="test-publish-failure")
    assert seen == ["c-1"]
    assert "could not publish wake-up for call c-1" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_raising_receiver_of_an_asks_wake_up_loses_neither_the_call_nor_its_notifications(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An ask's notifications are planned after its wake-ups (the push to the open queues
    comes first): a wake-up hook whose receiver raises is logged, and the plan still goes
    to the broker."""
    from approvals.models import ApprovalRequest
    from approvals.notifications import services as notifications
    from approvals.notifications.models import Channel
    from dispatcher import agents
    from dispatcher.models import Status
    from tests.support.factories import make_agent, submit_one

    Channel.objects.create(name="ops", kind="webhook", config={"url": "http://127.0.0.1:9/"})
    sent: list[tuple[str, object]] = []
    monkeypatch.setattr(notifications, "_send_task", lambda name, arg: sent.append((name, arg)))

    def broken(sender: Any, status: str, **kwargs: Any) -> None:
        sent.append(("wake-up", status))  # (after the push to the open queues: connected later)
        raise RuntimeError("a receiver that fails")

    session = agents.start_session(agent=make_agent(mode="standard").agent)
    signals.call_changed.connect(broken, dispatch_uid="test-broken-receiver")
    try:
        call = submit_one(session, "write_file", {"path": "a.txt", "content": "x"})  # no raise
    finally:
        signals.call_changed.disconnect(dispatch_uid="test-broken-receiver")
    assert call.status == Status.PENDING_APPROVAL
    approval = ApprovalRequest.objects.get(call=call)
    # The ask reached the open queues first, then its notifications were planned.
    assert sent == [
        ("wake-up", Status.PENDING_APPROVAL),
        (notifications.PLAN_ASK_TASK, approval.pk),
    ]
    assert "a receiver that fails" in caplog.text
