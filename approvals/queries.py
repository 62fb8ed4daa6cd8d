"""Read helpers for the reviewer screens (no writes)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from uuid import UUID

from dispatcher.models import ToolCall

from .models import ApprovalRequest

HISTORY_LIMIT = 20


def review_queue() -> list[ApprovalRequest]:
    """Pending requests, oldest first, each with `.history` (earlier calls of its session)."""
    approvals = list(
        ApprovalRequest.objects.pending()
        .select_related("call__session__agent")
        .order_by("created_at", "pk")
    )
    attach_history(approvals)
    return approvals


def one_request(approval_id: int) -> ApprovalRequest | None:
    approval = (
        ApprovalRequest.objects.select_related("call__session__agent", "decided_by")
        .filter(pk=approval_id)
        .first()
    )
    if approval is not None:
        attach_history([approval])
    return approval


def pending_for_call(call_id: str) -> ApprovalRequest | None:
    approval = (
        ApprovalRequest.objects.pending()
        .select_related("call__session__agent")
        .filter(call_id=UUID(call_id))
        .first()
    )
    if approval is not None:
        attach_history([approval])
    return approval


def attach_history(approvals: Iterable[ApprovalRequest]) -> None:
    """Set `.history` on each request: the latest HISTORY_LIMIT earlier calls of its session
    (and the other calls of its batch), with their outcomes.

    One query for all of them, whatever their number.
    """
    approvals = list(approvals)
    if not approvals:
        return
    by_session: dict[object, list[ToolCall]] = defaultdict(list)
    calls = ToolCall.objects.filter(session_id__in={a.call.session_id for a in approvals}).only(
        "id", "session_id", "batch_id", "name", "status", "decided_by", "reason", "created_at"
    )
    for call in calls.order_by("created_at", "batch_index"):
        by_session[call.session_id].append(call)
    for approval in approvals:
        earlier = [
            c
            for c in by_session[approval.call.session_id]
            if c.pk != approval.call_id
            and (c.created_at < approval.call.created_at or c.batch_id == approval.call.batch_id)
        ]
        approval.history = earlier[-HISTORY_LIMIT:]  # type: ignore[attr-defined]
