"""Deciding pending calls: exactly one decision per call, bound to the digest the reviewer saw."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from audit import kinds
from audit.roles import REVIEWER, has_role
from audit.services import record_event
from dispatcher import errors, transitions
from dispatcher.admission import context_of
from dispatcher.models import Status, ToolCall
from dispatcher.policy import grants

from .models import ApprovalRequest, Decision


class DecisionRefused(Exception):
    """The decision was not taken; `status` is the HTTP status a view should answer with."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def open_request(*, call: ToolCall, presentation: dict[str, Any]) -> ApprovalRequest:
    """Record the request for a call that just asked. Runs inside the call's transition."""
    return ApprovalRequest.objects.create(
        call=call,
        reason=call.reason,
        asked_by=call.decided_by,
        presentation=presentation,
        digest=call.digest,
        expires_at=timezone.now() + timedelta(seconds=settings.HARNESS_APPROVAL_TIMEOUT),
    )


def decide(
    *,
    approval_id: int,
    user: AbstractBaseUser,
    approve: bool,
    digest: str,
    feedback: str = "",
    allow_session: bool = False,
) -> ApprovalRequest:
    """Approve or deny one pending call as `user`, who saw arguments with `digest`.

    With `allow_session` (approve only), the same transaction also grants the narrowest
    rule naming this call (its exact command or path) for the rest of its session; when no
    such rule exists nothing is decided (400).

    Exactly one decision per call whatever the races: the approval row is locked and the
    call moves by a conditional update. Raises DecisionRefused: 403 (not a reviewer, or the
    agent's owner under separation of duties), 404 (no such request), 409 (already
    decided, naming by whom; or a digest mismatch, which is audited).
    """
    if not has_role(user, REVIEWER):
        raise DecisionRefused("Only reviewers can decide tool calls.", 403)
    with transaction.atomic():
        # Lock order everywhere: the approval row, then the call (dispatcher locks it).
        approval = (
            ApprovalRequest.objects.select_for_update(of=("self",))
            .select_related("call__session__agent")
            .filter(pk=approval_id)
            .first()
        )
        if approval is None:
            raise DecisionRefused("This approval request does not exist.", 404)
        now = timezone.now()  # the decision's time: checked against the deadline, recorded
        refusal = _refusal(approval, user, digest, now)
        if refusal is None:
            _apply(approval, user, approve, digest, feedback, now, allow_session and approve)
    # Raised after commit so that the audit event of a digest mismatch is kept.
    if refusal is not None:
        raise refusal
    return approval


def _refusal(
    approval: ApprovalRequest, user: AbstractBaseUser, digest: str, now: datetime
) -> DecisionRefused | None:
    call = approval.call
    if call.status != Status.PENDING_APPROVAL:
        return DecisionRefused(already_decided(approval), 409)
    if settings.HARNESS_EXPIRY_ACTION == "deny" and now >= approval.expires_at:
        # Past its time but not yet swept by the periodic expiry: expire it now, so that
        # no decision can land after the deadline whatever the scheduler's delay.
        _expire(approval)
        return DecisionRefused(already_decided(approval), 409)
    if settings.HARNESS_FORBID_SELF_APPROVAL and call.session.agent.owner_id == user.pk:
        return DecisionRefused("You own this agent; another reviewer must decide its calls.", 403)
    if digest != call.digest:
        _audit_mismatch(approval, user, digest)
        return DecisionRefused(
            "The arguments you reviewed do not match the logged arguments (digest mismatch). "
            "Reload the call and review it again.",
            409,
        )
    return None


def _apply(
    approval: ApprovalRequest,
    user: AbstractBaseUser,
    approve: bool,
    digest: str,
    feedback: str,
    now: datetime,
    allow_session: bool = False,
) -> None:
    call = approval.call
    actor = f"user:{user.get_username()}"
    extra: dict[str, Any] = {
        "reviewer": user.get_username(),
        "digest_seen": digest,
        "feedback": feedback,
        "decision_seconds": round((now - approval.created_at).total_seconds(), 3),
    }
    if allow_session:
        try:
            extra["session_grant"] = grants.narrow_rule(context_of(call))
        except errors.ServiceError as problem:
            raise DecisionRefused(str(problem), 400) from None
    if approve:
        done = transitions.approve_call(
            call_id=call.pk, actor=actor, reason=feedback, extra=extra, call=call
        )
    else:
        done = transitions.deny_call(
            call_id=call.pk,
            actor=actor,
            reviewer=user.get_username(),
            feedback=feedback,
            extra=extra,
            call=call,
        )
    if not done:
        # The call moved first (the agent cancelled it, or another decision won the
        # conditional update): nothing here is recorded; the transaction rolls back.
        raise DecisionRefused(already_decided(approval), 409)
    if allow_session:
        approval.grant = grants.grant_for_session(ctx=context_of(call), actor=user)  # type: ignore[arg-type,attr-defined]
    approval.decision = Decision.APPROVED if approve else Decision.DENIED
    approval.decided_by = user  # type: ignore[assignment]
    approval.decided_at = now
    approval.feedback = feedback
    approval.digest_seen = digest
    approval.save(update_fields=["decision", "decided_by", "decided_at", "feedback", "digest_seen"])


def already_decided(approval: ApprovalRequest) -> str:
    call = approval.call
    call.refresh_from_db()
    who = call.decided_by.removeprefix("user:") or "the system"
    return f"Already decided by {who}: the call is {call.status.replace('_', ' ')}."


def _audit_mismatch(approval: ApprovalRequest, user: AbstractBaseUser, digest: str) -> None:
    record_event(
        kind=kinds.APPROVAL_DIGEST_MISMATCH,
        actor=f"user:{user.get_username()}",
        subject=f"call:{approval.call_id}",
        session_id=approval.call.session_id,
        payload={
            "call_id": str(approval.call_id),
            "digest_seen": digest,
            "digest_logged": approval.call.digest,
        },
    )


def expire_due() -> int:
    """Close every approval past its expiry, per HARNESS_EXPIRY_ACTION ('deny' or 'keep')."""
    if settings.HARNESS_EXPIRY_ACTION == "keep":
        return 0
    expired = 0
    for approval_id in ApprovalRequest.objects.due(timezone.now()).values_list("pk", flat=True):
        with transaction.atomic():
            approval = (
                ApprovalRequest.objects.select_for_update(of=("self",))
                .select_related("call")
                .get(pk=approval_id)
            )
            expired += _expire(approval)
    return expired


def _expire(approval: ApprovalRequest) -> bool:
    """Expire one pending approval (its row is locked by the caller)."""
    minutes = settings.HARNESS_APPROVAL_TIMEOUT / 60
    if not transitions.expire_call(call_id=approval.call_id, minutes=minutes):
        return False
    approval.decision, approval.decided_at = Decision.EXPIRED, timezone.now()
    approval.save(update_fields=["decision", "decided_at"])
    return True


def record_cancel(*, call_id: str) -> None:
    """The agent cancelled its pending call: close its request (after the call's commit)."""
    ApprovalRequest.objects.filter(call_id=UUID(call_id), decision="").update(
        decision=Decision.CANCELLED, decided_at=timezone.now()
    )
