"""The approvals app's side of the dispatcher's after-commit signal (dispatcher never imports
approvals). The ask's request row is not written here: see settings.HARNESS_ASK_RECORDER."""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import receiver

from dispatcher.models import Status
from dispatcher.signals import call_changed

from . import live, services
from .notifications import services as notifications

logger = logging.getLogger(__name__)


@receiver(call_changed)
def push_to_open_queues(
    sender: Any, call_id: str, session_id: str, status: str, previous: str = "", **kwargs: Any
) -> None:
    """Sent after commit: new asks appear in, and decided calls leave, every open queue."""
    if status == Status.CANCELLED and previous == Status.PENDING_APPROVAL:
        services.record_cancel(call_id=call_id)
    team_id = None
    if previous == Status.PENDING_APPROVAL and status != Status.PENDING_APPROVAL:
        try:
            # (its read also gives the call's team, which the removal is sent to)
            team_id = notifications.enqueue_outcome(call_id)
        except Exception:  # a lost second event must not break the other receivers
            logger.warning("could not plan the outcome event of %s", call_id, exc_info=True)
    live.push_change(call_id, status, previous, team_id=team_id)
