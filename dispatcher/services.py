"""Every state change of agents, sessions and calls (admission: stages 1 to 5).

Each transition is one conditional update plus its audit event in one transaction; pushes
and enqueues happen after commit. Execution (stages 6 to 10) is in dispatcher.execution.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.services import record_event

from . import messages, notify, pipeline
from .context import CallContext, Decision, Profile
from .dialects import ProposedCall, digest_of
from .models import (
    TERMINAL_STATUSES,
    TRANSITIONS,
    Agent,
    AgentSession,
    Mode,
    PermissionProfile,
    Status,
    ToolCall,
    narrower_mode,
)
from .registry import get_tool

TOKEN_PREFIX = "hrn"


class ServiceError(Exception):
    """A request the service refuses; the message is for the person or agent who asked."""


# --- Agents, tokens, modes -------------------------------------------------------------


def _hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@transaction.atomic
def create_agent(*, owner: User, name: str, workspace: str = "", actor: str) -> tuple[Agent, str]:
    """Create an agent and return it with its token. The token is never stored or shown again."""
    if workspace:
        path = Path(workspace).expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True)
        workspace = str(path)
    prefix = secrets.token_hex(4)
    token = f"{TOKEN_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    agent = Agent.objects.create(
        owner=owner,
        name=name,
        token_prefix=prefix,
        token_hash=_hash_token(token),
        workspace=workspace,
    )
    PermissionProfile.objects.get_or_create(user=owner, defaults=default_profile())
    record_event(
        kind="agent.created",
        actor=actor,
        subject=f"agent:{agent.pk}",
        payload={
            "name": name,
            "owner": owner.get_username(),
            "token_prefix": prefix,
            "workspace": workspace,
        },
    )
    return agent, token


def authenticate_token(token: str) -> Agent | None:
    """The active agent holding `token`, or None. Constant-time comparison of the hash."""
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        return None
    agent = (
        Agent.objects.select_related("owner").filter(token_prefix=parts[1], is_active=True).first()
    )
    if agent is None or not hmac.compare_digest(agent.token_hash, _hash_token(token)):
        return None
    return agent


@transaction.atomic
def revoke_agent(*, agent: Agent, actor: str) -> None:
    if Agent.objects.filter(pk=agent.pk, is_active=True).update(
        is_active=False, revoked_at=timezone.now()
    ):
        record_event(
            kind="agent.revoked",
            actor=actor,
            subject=f"agent:{agent.pk}",
            payload={"name": agent.name},
        )


def default_profile() -> dict[str, Any]:
    """What a user without a saved profile has: HARNESS_DEFAULT_MODE and _RULES."""
    rules = settings.HARNESS_DEFAULT_RULES
    return {
        "mode": settings.HARNESS_DEFAULT_MODE,
        **{key: list(rules.get(key, [])) for key in ("allow", "ask", "deny")},
    }


def profile_for(user: User) -> Profile:
    row = PermissionProfile.objects.filter(user=user).first()
    if row is None:
        default = default_profile()
        return Profile(
            mode=default["mode"],
            allow=tuple(default["allow"]),
            ask=tuple(default["ask"]),
            deny=tuple(default["deny"]),
        )
    return Profile(
        mode=row.mode,
        allow=tuple(row.allow),
        ask=tuple(row.ask),
        deny=tuple(row.deny),
        version=row.version,
    )


# --- Sessions --------------------------------------------------------------------------


@transaction.atomic
def start_session(*, agent: Agent, title: str = "", mode: str | None = None) -> AgentSession:
    """Start a session. Its mode may only narrow the owner's; its workspace is never the agent's choice."""
    owner_mode = profile_for(agent.owner).mode
    if mode is not None and mode not in Mode.values:
        raise ServiceError(f"Unknown mode '{mode}'. Choose one of: {', '.join(Mode.values)}.")
    effective = narrower_mode(mode, owner_mode) if mode else owner_mode
    session_id = uuid.uuid4()
    if agent.workspace:
        workspace = Path(agent.workspace)
    else:
        workspace = Path(settings.HARNESS_WORKSPACE_ROOT).resolve() / str(session_id)
    workspace.mkdir(parents=True, exist_ok=True)
    session = AgentSession.objects.create(
        id=session_id, agent=agent, title=title[:200], mode=effective, workspace=str(workspace)
    )
    record_event(
        kind="session.started",
        actor=f"agent:{agent.name}",
        session_id=session.pk,
        subject=f"session:{session.pk}",
        payload={
            "agent": agent.name,
            "owner": agent.owner.get_username(),
            "title": session.title,
            "requested_mode": mode,
            "mode": effective,
            "workspace": str(workspace),
        },
    )
    return session


def mode_and_profile(session: AgentSession) -> tuple[str, Profile]:
    """The owner's profile (one read), and the session's mode narrowed further if the
    owner's mode was narrowed since the session started."""
    profile = profile_for(session.agent.owner)
    return narrower_mode(session.mode, profile.mode), profile


# --- Transitions -----------------------------------------------------------------------


def transition(
    call: ToolCall, to: Status, *, kind: str, actor: str, payload: dict[str, Any], **fields: Any
) -> bool:
    """Move `call` from its current status to `to`: one conditional update plus its audit event.

    Returns False (and changes nothing) if another process moved the call first. Must run
    inside transaction.atomic(); the wake-up is published after commit.
    """
    if (call.status, to) not in TRANSITIONS:
        raise ServiceError(f"A call cannot go from {call.status} to {to}.")
    if to in TERMINAL_STATUSES:
        fields.setdefault("finished_at", timezone.now())
    if not ToolCall.objects.filter(pk=call.pk, status=call.status).update(status=to, **fields):
        return False
    record_event(
        kind=kind,
        actor=actor,
        subject=f"call:{call.pk}",
        session_id=call.session_id,
        payload={
            "call_id": str(call.pk),
            "tool": call.name,
            "from": call.status,
            "to": to,
            # What the model receives, when this transition ends the call with a message.
            **(
                {"content": fields["content"], "is_error": fields.get("is_error", False)}
                if "content" in fields
                else {}
            ),
            **payload,
        },
    )
    previous, call.status = call.status, to
    for name, value in fields.items():
        setattr(call, name, value)
    call_id, session_id = str(call.pk), str(call.session_id)
    transaction.on_commit(lambda: notify.publish_change(call_id, session_id, to, previous))
    return True


def _finish_text(call: ToolCall, text: str) -> str:
    return text + messages.repeat_reminder(call.repeat_count, call.name, call.raw_arguments)


def _decision_fields(
    call: ToolCall, decision: Decision, content: str | None = None
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "decision": decision.action,
        "decided_by": decision.by,
        "reason": decision.reason,
        "provenance": {**call.provenance, **decision.as_provenance()},
    }
    if content is not None:
        fields["content"] = _finish_text(call, content)
        fields["is_error"] = True
    return fields


# --- Admission: stages 1 to 5 ------------------------------------------------------------


def submit_calls(
    *, session: AgentSession, dialect: str, proposed: list[ProposedCall]
) -> list[ToolCall]:
    """Admit one assistant message's calls; return them in request order.

    Idempotent by tool_use_id: a call already seen in the session is returned as it is,
    never created twice (also under concurrent submissions of the same message).
    """
    mode, profile = mode_and_profile(session)
    batch_id = uuid.uuid4()
    # One transaction for the whole message: one commit (one WAL flush) instead of one
    # per transition. Each call is still logged (call.received) before it is decided.
    with transaction.atomic():
        existing = {
            c.tool_use_id: c
            for c in ToolCall.objects.filter(
                session=session, tool_use_id__in=[p.tool_use_id for p in proposed]
            )
        }
        calls = []
        for index, item in enumerate(proposed):
            call = existing.get(item.tool_use_id) or receive(
                session, dialect, item, batch_id, index
            )
            if call.status == Status.RECEIVED and call.batch_id == batch_id:
                _decide(call, item, session, mode, profile)
            calls.append(call)
        new = [c for c in calls if c.batch_id == batch_id]
        if new:
            from .execution import dispatch_ready  # execution imports this module

            dispatch_ready(batch_id, new)
    return calls


def receive(
    session: AgentSession, dialect: str, item: ProposedCall, batch_id: uuid.UUID, index: int
) -> ToolCall:
    """Stage 1, receive: store the call with its exact arguments and digest, and audit call.received."""
    digest = digest_of(item)
    repeat_count = 1
    if item.name not in settings.HARNESS_REPEAT_EXCLUDED_TOOLS:
        repeat_count += ToolCall.objects.filter(
            session=session, name=item.name, digest=digest
        ).count()
    try:
        with transaction.atomic():
            call = ToolCall.objects.create(
                session=session,
                tool_use_id=item.tool_use_id,
                name=item.name,
                raw_arguments=item.raw_arguments,
                arguments=item.arguments,
                digest=digest,
                dialect=dialect,
                batch_id=batch_id,
                batch_index=index,
                repeat_count=repeat_count,
            )
            record_event(
                kind="call.received",
                actor=f"agent:{session.agent.name}",
                subject=f"call:{call.pk}",
                session_id=session.pk,
                payload={
                    "call_id": str(call.pk),
                    "tool_use_id": item.tool_use_id,
                    "tool": item.name,
                    "arguments": item.raw_arguments,
                    "digest": digest,
                    "dialect": dialect,
                    "batch_id": str(batch_id),
                    "batch_index": index,
                    "repeat_count": repeat_count,
                },
            )
    except IntegrityError:
        # The same message was submitted concurrently and the other request won; any
        # other integrity failure (an audit store refusing the write) is not ours to hide.
        winner = ToolCall.objects.filter(session=session, tool_use_id=item.tool_use_id).first()
        if winner is None:
            raise
        return winner
    return call


def call_context(
    call: ToolCall, session: AgentSession, mode: str, profile: Profile
) -> CallContext | None:
    tool = get_tool(call.name)
    if tool is None or call.arguments is None:
        return None
    return CallContext(
        call_id=str(call.pk),
        session_id=str(session.pk),
        tool=tool,
        name=call.name,
        arguments=call.arguments,
        workspace=Path(session.workspace),
        mode=mode,
        username=session.agent.owner.get_username(),
        agent_name=session.agent.name,
        profile=profile,
        agent_active=session.agent.is_active,
    )


def _reject(call: ToolCall, reason: str, stage: str) -> None:
    decision = Decision("deny", f"stage:{stage}", reason)
    with transaction.atomic(savepoint=False):
        fields = _decision_fields(call, decision, reason)
        fields["decision"] = "reject"
        transition(
            call,
            Status.REJECTED,
            kind="call.rejected",
            actor="harness",
            payload={"stage": stage, "reason": reason},
            **fields,
        )


def _decide(
    call: ToolCall, item: ProposedCall, session: AgentSession, mode: str, profile: Profile
) -> None:
    """Stages 2 to 5: resolve, validate, pre_execute, guards; then the transition they chose."""
    if item.parse_error:
        message = (
            f"Could not read the arguments of '{call.name}': {item.parse_error} Send a JSON object."
        )
        return _reject(call, message, "receive")
    try:
        tool = pipeline.resolve(call.name)
        pipeline.validate(tool, call.arguments or {})
    except pipeline.Rejection as rejection:
        return _reject(call, rejection.message, rejection.stage)
    ctx = call_context(call, session, mode, profile)
    assert ctx is not None
    call.provenance = {"mode": mode, "profile_version": profile.version}
    decision = pipeline.pre_execute(ctx)
    if decision.action == "deny":
        return _settle(
            call, Status.DENIED, decision, "call.denied", messages.policy_denied(decision.reason)
        )
    if decision.action == "cancel":
        text = messages.cancelled(decision.by, decision.reason)
        return _settle(call, Status.CANCELLED, decision, "call.cancelled", text)
    denials = pipeline.guards(ctx)
    if denials:
        guard = Decision(
            "deny", "guard:" + ",".join(n for n, _ in denials), " ".join(r for _, r in denials)
        )
        return _settle(
            call,
            Status.DENIED,
            guard,
            "call.denied",
            messages.guard_denied([r for _, r in denials]),
        )
    if decision.action == "ask":
        return _ask(call, decision, tool.present_call(call.arguments or {}, ctx.workspace))
    with transaction.atomic(savepoint=False):
        transition(
            call,
            Status.QUEUED,
            kind="call.allowed",
            actor=decision.by,
            payload={**call.provenance, **decision.as_provenance()},
            queued_at=timezone.now(),
            **_decision_fields(call, decision),
        )
    return None


def _settle(call: ToolCall, to: Status, decision: Decision, kind: str, text: str) -> None:
    with transaction.atomic(savepoint=False):
        transition(
            call,
            to,
            kind=kind,
            actor=decision.by,
            payload={**call.provenance, **decision.as_provenance()},
            **_decision_fields(call, decision, text),
        )


def _ask(call: ToolCall, decision: Decision, presentation: dict[str, Any]) -> None:
    with transaction.atomic(savepoint=False):
        if transition(
            call,
            Status.PENDING_APPROVAL,
            kind="call.approval_requested",
            actor=decision.by,
            payload={**call.provenance, **decision.as_provenance(), "presentation": presentation},
            **_decision_fields(call, decision),
        ):
            notify.approval_requested.send(sender=ToolCall, call=call, presentation=presentation)


# --- Decisions on pending calls (reviewers, expiry, the agent) ---------------------------


def _decide_pending(
    call_id: uuid.UUID | str,
    to: Status,
    decision: Decision,
    kind: str,
    text: str | None,
    extra: dict[str, Any] | None = None,
    **fields: Any,
) -> bool:
    """Close a pending call as `to`: lock it, check it is still pending, transition, and
    send what may run next in its batch (after commit). False if it was no longer pending.

    Joins the caller's transaction when there is one (the approvals app records its own
    row in the same commit).
    """
    with transaction.atomic():
        call = ToolCall.objects.select_for_update().get(pk=call_id)
        if call.status != Status.PENDING_APPROVAL:
            return False
        done = transition(
            call,
            to,
            kind=kind,
            actor=decision.by,
            payload={**decision.as_provenance(), **(extra or {})},
            **fields,
            **_decision_fields(call, decision, text),
        )
        if done:
            from .execution import dispatch_ready

            # In the same transaction (one commit); the messages still leave after it.
            dispatch_ready(call.batch_id)
        return done


def approve_call(
    *, call_id: uuid.UUID | str, actor: str, reason: str = "", extra: dict[str, Any] | None = None
) -> bool:
    """Approve a pending call; it is queued to run. False if it was no longer pending."""
    decision = Decision("allow", actor, reason or "Approved by a reviewer.")
    return _decide_pending(
        call_id, Status.QUEUED, decision, "call.approved", None, extra, queued_at=timezone.now()
    )


def deny_call(
    *,
    call_id: uuid.UUID | str,
    actor: str,
    reviewer: str,
    feedback: str = "",
    extra: dict[str, Any] | None = None,
) -> bool:
    """Deny a pending call; `feedback` reaches the model as the tool result."""
    decision = Decision("deny", actor, feedback or "Denied by a reviewer.")
    text = messages.reviewer_denied(reviewer, feedback)
    return _decide_pending(call_id, Status.DENIED, decision, "call.denied", text, extra)


def cancel_call(*, call_id: uuid.UUID | str, actor: str, reason: str = "") -> bool:
    decision = Decision("cancel", actor, reason or "Cancelled.")
    text = messages.cancelled(actor, reason)
    return _decide_pending(call_id, Status.CANCELLED, decision, "call.cancelled", text)


def expire_call(*, call_id: uuid.UUID | str, minutes: float) -> bool:
    decision = Decision("deny", "expiry", f"No decision within {minutes:g} minutes.")
    text = messages.expired(minutes)
    return _decide_pending(call_id, Status.EXPIRED, decision, "call.expired", text)
