"""The approvals app's side of the dispatcher's signals (dispatcher never imports approvals)."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from dispatcher.models import Status
from dispatcher.notify import approval_requested, call_changed

from . import live, services


@receiver(approval_requested)
def record_request(sender: Any, call: Any, presentation: dict[str, Any], **kwargs: Any) -> None:
    services.open_request(call=call, presentation=presentation)


@receiver(call_changed)
def push_to_open_queues(
    sender: Any, call_id: str, session_id: str, status: str, previous: str = "", **kwargs: Any
) -> None:
    """Sent after commit: new asks appear in, and decided calls leave, every open queue."""
    if status == Status.CANCELLED and previous == Status.PENDING_APPROVAL:
        services.record_cancel(call_id=call_id)
    live.push_change(call_id, status, previous)
