"""A wake-up that cannot be published never fails what was committed: any failure of the
Redis client in publish_change (seen under load: ValueError from redis-py's connect) is
logged, and the change's other receivers still run."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher import notify


class BrokenClient:
    def publish(self, *args: Any) -> None:
        raise ValueError("I/O operation on closed file.")


def test_a_client_failure_is_logged_and_the_signal_still_sent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(notify, "redis_at", lambda url: BrokenClient())
    seen: list[str] = []

    def receiver(sender: Any, call_id: str, **kwargs: Any) -> None:
        seen.append(call_id)

    notify.call_changed.connect(receiver, dispatch_uid="test-publish-failure")
    try:
        notify.publish_change("c-1", "s-1", "completed", "running")  # does not raise
    finally:
        notify.call_changed.disconnect(dispatch_uid="test-publish-failure")
    assert seen == ["c-1"]
    assert "could not publish wake-up for call c-1" in caplog.text
