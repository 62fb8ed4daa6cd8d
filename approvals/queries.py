"""Read helpers for the reviewer screens (no writes)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from uuid import UUID

from django.db.models import Q, prefetch_related_objects

from dispatcher.models import ToolCall
from floor.compiled import Compiled

from .models import ApprovalRequest

HISTORY_LIMIT = 20
# The most requests one page or one (re)connect carries: a socket message must stay well
# under daphne's 1 MiB frame limit (an item is a few kilobytes).
QUEUE_LIMIT = 50


def review_queue() -> tuple[list[ApprovalRequest], int]:
    """The oldest QUEUE_LIMIT pending requests, each with `.history` (earlier calls of its
    session), and how many more are pending beyond them."""
    limit = QUEUE_LIMIT
    pending = ApprovalRequest.objects.pending()
    approvals = list(
        pending.select_related("call__session__agent")
        .prefetch_related("votes__voter")
        .order_by("created_at", "pk")[:limit]
    )
    more = pending.count() - len(approvals) if len(approvals) == limit else 0
    attach_history(approvals)
    return approvals, more


def one_request(approval_id: int) -> ApprovalRequest | None:
    approval = (
        ApprovalRequest.objects.select_related("call__session__agent", "decided_by")
        .prefetch_related("votes__voter")
        .filter(pk=approval_id)
        .first()
    )
    if approval is not None:
        attach_history([approval])
    return approval


def pending_by_id(approval_id: int) -> ApprovalRequest | None:
    return (
        ApprovalRequest.objects.pending()
        .select_related("call__session__agent")
        .prefetch_related("votes__voter")
        .filter(pk=approval_id)
        .first()
    )


# Read for every ask pushed to the open queues (floor.compiled).
_PENDING_FOR_CALL = Compiled(
    lambda call_id: (
        ApprovalRequest.objects.pending()
        .select_related("call__session__agent")
        .filter(call_id=call_id)
        .order_by("pk")[:1]
    )
)


def pending_for_call(call_id: str) -> ApprovalRequest | None:
    approval = _PENDING_FOR_CALL.first(UUID(call_id))
    if approval is not None:
        if approval.is_quorum:  # (only a quorum's request has votes, or shows them)
            prefetch_related_objects([approval], "votes__voter")
        attach_history([approval])
    return approval


@dataclass(frozen=True, slots=True)
class EarlierCall:
    """One earlier call of a request's session, as its session context shows it."""

    tool_use_id: str
    name: str
    status: str
    decided_by: str
    reason: str


def attach_history(approvals: Iterable[ApprovalRequest]) -> None:
    """Set `.history` on each request: the latest HISTORY_LIMIT earlier calls of its session
    (and the other calls of its batch), with their outcomes, oldest first, as EarlierCall
    rows (plain values: no model instance is built for a row that is only shown).

    One small indexed query per request, whatever the size of its session.
    """
    for approval in approvals:
        call = approval.call
        earlier = _HISTORY.tuples(call.session_id, call.created_at, call.batch_id, call.pk)
        approval.history = [EarlierCall(*row) for row in reversed(earlier)]  # type: ignore[attr-defined]


# Read for every request shown or pushed (floor.compiled).
_HISTORY = Compiled(
    lambda session_id, created_at, batch_id, pk: (
        ToolCall.objects.filter(session_id=session_id)
        .filter(Q(created_at__lt=created_at) | Q(batch_id=batch_id))
        .exclude(pk=pk)
        .order_by("-created_at", "-batch_index")
        .values_list("tool_use_id", "name", "status", "decided_by", "reason")[:HISTORY_LIMIT]
    )
)
