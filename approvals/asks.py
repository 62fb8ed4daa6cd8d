"""What admission calls when a call asks (settings.HARNESS_ASK_RECORDER, checked at start-up
as dispatcher.E013): the lifecycle never imports approvals, and a write it needs is not left
to a signal that may have no receiver."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dispatcher.models import ToolCall

from . import services
from .notifications import services as notifications


def record_ask(*, call: ToolCall, presentation: dict[str, Any]) -> None:
    """Inside the transaction that put `call` in pending_approval: write its request row
    (raising rolls the admission back), and plan its notifications for after commit."""
    approval = services.open_request(call=call, presentation=presentation)
    notifications.enqueue_ask(approval.pk)  # after commit: never holds up admission


def escalate_due(now: datetime | None = None) -> int:
    """The periodic escalation (approvals.tasks): escalate what is due, then tell each
    next tier through the channels. `now`: the clock (tests pass theirs)."""
    escalated = services.escalate_due(now)
    for approval_id in escalated:
        notifications.enqueue_escalation(approval_id)
    return len(escalated)
