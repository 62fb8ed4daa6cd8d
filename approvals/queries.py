"""Read helpers for the reviewer screens (no writes)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db.models import Count, F, Q, QuerySet, Window, prefetch_related_objects
from django.db.models.functions import RowNumber

from dispatcher.models import ToolCall
from floor.compiled import Compiled
from teams.scope import ASK_TEAMS, Scope

from .models import ApprovalRequest

# The path from a request to the team of its call's agent (teams.scope reads it).
TEAM = "call__session__team_id"


def reached(rows: QuerySet[ApprovalRequest], reach: Scope) -> QuerySet[ApprovalRequest]:
    """The requests `reach` decides: of its teams' agents, or escalated to its teams
    (teams.scope.ASK_TEAMS)."""
    return reach.filter_either(rows, *ASK_TEAMS)


HISTORY_LIMIT = 20
# The most requests one page or one (re)connect carries: a socket message must stay well
# under daphne's 1 MiB frame limit (an item is a few kilobytes).
QUEUE_LIMIT = 50


def review_queue(reach: Scope) -> tuple[list[ApprovalRequest], int]:
    """At most QUEUE_LIMIT pending requests of agents `reach` covers, taken fairly: each
    agent's oldest first, then
    each agent's second oldest, and so on (a burst from one agent never hides another
    agent's ask), each with `.history` (earlier calls of its session); and how many more
    are pending beyond them."""
    limit = QUEUE_LIMIT
    pending = reached(ApprovalRequest.objects.pending(), reach)
    turn = Window(
        RowNumber(),
        partition_by=[F("call__session__agent_id")],
        order_by=[F("created_at").asc(), F("pk").asc()],
    )
    # The choice reads narrow rows only; then the chosen requests are read whole (their
    # calls' arguments and presentations may be large).
    chosen = list(
        pending.annotate(turn=turn)
        .order_by("turn", "created_at", "pk")
        .values_list("pk", flat=True)[:limit]
    )
    by_pk = {
        a.pk: a
        for a in ApprovalRequest.objects.filter(pk__in=chosen)
        .select_related("call__session__agent")
        .prefetch_related("votes__voter")
    }
    approvals = [by_pk[pk] for pk in chosen if pk in by_pk]
    more = pending.count() - len(approvals) if len(approvals) == limit else 0
    attach_history(approvals)
    return approvals, more


def queue_context(reach: Scope) -> dict[str, Any]:
    """What the queue's items fragment shows to a reviewer of `reach`: the requests, how
    many more wait, and (when some are left out) how many each agent has pending."""
    approvals, more = review_queue(reach)
    mark_escalated_only(approvals, reach)
    per_agent = pending_per_agent(reach) if more else []
    return {"approvals": approvals, "more": more, "per_agent": per_agent}


def pending_per_agent(reach: Scope) -> list[tuple[str, int]]:
    """(agent name, pending requests) for every agent `reach` covers with any, the most
    first: what a queue that shows only QUEUE_LIMIT of them says it leaves out."""
    rows = (
        reached(ApprovalRequest.objects.pending(), reach)
        .values_list("call__session__agent__name")
        .annotate(count=Count("pk"))
        .order_by("-count", "call__session__agent__name")
    )
    return [(name, count) for name, count in rows]


def one_request(approval_id: int, reach: Scope) -> ApprovalRequest | None:
    """The request, if `reach` covers its agent's team (None otherwise, as for a request
    that does not exist: another team's asks are not shown, not even as refused)."""
    approval = (
        reached(ApprovalRequest.objects.all(), reach)
        .select_related("call__session__agent", "decided_by")
        .prefetch_related("votes__voter")
        .filter(pk=approval_id)
        .first()
    )
    if approval is not None:
        attach_history([approval])
        mark_escalated_only([approval], reach)
    return approval


def mark_escalated_only(approvals: Iterable[ApprovalRequest], reach: Scope) -> None:
    """Set `.escalated_only` on each request `reach` sees only through its escalation: its
    reviewer decides the ask but may not allow it for the agent's session
    (services._escalated_only), so the queue offers them no such button."""
    for approval in approvals:
        approval.escalated_only = not reach.covers(approval.call.session.team_id)


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
