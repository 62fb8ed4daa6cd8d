"""Every state change of agents, sessions and calls (admission: stages 1 to 5).

Each transition is one conditional update plus its audit event in one transaction; pushes
and enqueues happen after commit. Execution (stages 6 to 10) is in dispatcher.execution.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Count, Exists, OuterRef
from django.utils import timezone

from audit.services import EventSpec, record_event, record_events

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
    SessionGrant,
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


def token_prefix(token: str) -> str | None:
    """The visible prefix of a well-formed agent token (None: not an agent token)."""
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        return None
    return parts[1]


def authenticate_token(token: str) -> Agent | None:
    """The active agent holding `token`, or None. Constant-time comparison of the hash."""
    prefix = token_prefix(token)
    if prefix is None:
        return None
    agent = (
        Agent.objects.select_related("owner").filter(token_prefix=prefix, is_active=True).first()
    )
    if agent is None or not _token_matches(agent, token):
        return None
    return agent


def _token_matches(agent: Agent, token: str) -> bool:
    return hmac.compare_digest(agent.token_hash, _hash_token(token))


def session_for_token(token: str, session_id: uuid.UUID) -> AgentSession | None:
    """The session `session_id` if `token` is its active agent's, read with what admission
    needs (agent, owner, the owner's profile, whether it holds any grant) in one query:
    the agent API's submit path authenticates and loads in one read. None otherwise
    (unknown or foreign session, or a bad token: the caller tells them apart)."""
    prefix = token_prefix(token)
    if prefix is None:
        return None
    session = (
        AgentSession.objects.select_related("agent__owner__permission_profile")
        .annotate(has_grants=Exists(SessionGrant.objects.active().filter(session=OuterRef("pk"))))
        .filter(pk=session_id, agent__token_prefix=prefix, agent__is_active=True)
        .first()
    )
    if session is None or not _token_matches(session.agent, token):
        return None
    return session


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


def profile_for(user: User, *, preloaded: bool = False) -> Profile:
    """The user's profile. `preloaded`: the caller has just read `user` with
    select_related("permission_profile"), so that row is used instead of a new read."""
    if preloaded:
        row = getattr(user, "permission_profile", None)  # None: the user has no saved profile
    else:
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


def mode_and_profile(session: AgentSession, *, preloaded: bool = False) -> tuple[str, Profile]:
    """The owner's profile (one read, none when `preloaded`: see profile_for), and the
    session's mode narrowed further if the owner's mode was narrowed since the session started."""
    profile = profile_for(session.agent.owner, preloaded=preloaded)
    return narrower_mode(session.mode, profile.mode), profile


# --- Transitions -----------------------------------------------------------------------


def transition(
    call: ToolCall,
    to: Status,
    *,
    kind: str,
    actor: str,
    payload: dict[str, Any],
    publish: bool = True,
    **fields: Any,
) -> bool:
    """Move `call` from its current status to `to`: one conditional update plus its audit event.

    Returns False (and changes nothing) if another process moved the call first. Must run
    inside transaction.atomic(); the wake-up is published after commit (`publish=False`:
    the caller schedules it with publish_after_commit).
    """
    _check_transition(call, to, fields)
    previous = call.status
    if not ToolCall.objects.filter(pk=call.pk, status=previous).update(status=to, **fields):
        return False
    spec = _apply(call, to, kind=kind, actor=actor, payload=payload, fields=fields, at=None)
    record_events([spec], session_id=call.session_id)  # timed under the chain lock
    if publish:
        publish_after_commit(call, previous)
    return True


def _check_transition(call: ToolCall, to: Status, fields: dict[str, Any]) -> None:
    if (call.status, to) not in TRANSITIONS:
        raise ServiceError(f"A call cannot go from {call.status} to {to}.")
    if to in TERMINAL_STATUSES:
        fields.setdefault("finished_at", timezone.now())


def _apply(
    call: ToolCall,
    to: Status,
    *,
    kind: str,
    actor: str,
    payload: dict[str, Any],
    fields: dict[str, Any],
    at: datetime | None,
) -> EventSpec:
    """Set the new status and fields on `call` (in memory) and return its audit event
    (timed `at`, or when it is appended)."""
    spec = EventSpec(
        kind,
        actor,
        f"call:{call.pk}",
        {
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
        at,
    )
    call.status = to
    for name, value in fields.items():
        setattr(call, name, value)
    return spec


def publish_after_commit(call: ToolCall, previous: str) -> None:
    """Announce the call's change (from `previous` to its status now) once committed."""
    call_id, session_id, to = str(call.pk), str(call.session_id), str(call.status)
    transaction.on_commit(lambda: notify.publish_change(call_id, session_id, to, previous))


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
    *,
    session: AgentSession,
    dialect: str,
    proposed: list[ProposedCall],
    profile_preloaded: bool = False,
) -> list[ToolCall]:
    """Admit one assistant message's calls; return them in request order.

    Idempotent by tool_use_id: a call already seen in the session is returned as it is,
    never created twice (also under concurrent submissions of the same message).
    `profile_preloaded`: see profile_for (the agent API reads it with the session).
    """
    mode, profile = mode_and_profile(session, preloaded=profile_preloaded)
    try:
        return _admit(session, dialect, proposed, mode, profile)
    except IntegrityError:
        # The same message was submitted concurrently and the other request won (one call
        # per tool_use_id): admitting again finds its calls. Any other integrity failure
        # (an audit store refusing the write) is not ours to hide.
        ids = [p.tool_use_id for p in proposed]
        if not ToolCall.objects.filter(session=session, tool_use_id__in=ids).exists():
            raise
        return _admit(session, dialect, proposed, mode, profile)


@dataclass
class _Admission:
    """The new calls of one message, decided in memory, then written at once."""

    calls: list[ToolCall] = field(default_factory=list)
    events: list[EventSpec] = field(default_factory=list)
    asks: list[tuple[ToolCall, dict[str, Any]]] = field(default_factory=list)


def _admit(
    session: AgentSession, dialect: str, proposed: list[ProposedCall], mode: str, profile: Profile
) -> list[ToolCall]:
    """One transaction (one commit) for the whole message: the calls are inserted already
    decided, with their call.received and decision events in one append (received first,
    timed when it was received), then the runnable ones are sent after commit."""
    from .execution import startable  # execution imports this module

    batch_id = uuid.uuid4()
    with transaction.atomic():
        known = {
            c.tool_use_id: c
            for c in ToolCall.objects.filter(
                session=session, tool_use_id__in=[p.tool_use_id for p in proposed]
            )
        }
        digests = {p.tool_use_id: digest_of(p) for p in proposed if p.tool_use_id not in known}
        counts = _repeat_counts(
            session,
            {(p.name, digests[p.tool_use_id]) for p in proposed if p.tool_use_id in digests},
        )
        admission = _Admission()
        calls = []
        for index, item in enumerate(proposed):
            call = known.get(item.tool_use_id)
            if call is None:  # new (a repeated id within one message is one call)
                digest = digests[item.tool_use_id]
                call = known[item.tool_use_id] = receive(
                    session, dialect, item, digest, batch_id, index, counts, admission
                )
                admission.events.append(_decide(call, item, session, mode, profile, admission))
            calls.append(call)
        if admission.calls:
            sent = startable(admission.calls)
            now = timezone.now()
            for call in sent:
                call.enqueued_at = now
            ToolCall.objects.bulk_create(admission.calls)
            record_events(admission.events, session_id=session.pk)
            for call, presentation in admission.asks:
                notify.approval_requested.send(
                    sender=ToolCall, call=call, presentation=presentation
                )
            _after_admission(admission.calls, sent)
    return calls


def _after_admission(calls: list[ToolCall], sent: list[ToolCall]) -> None:
    """After commit: the workers' messages first, then the wake-ups and pushes. A message
    the broker refuses is logged and left to the reconciler (the call stays queued)."""
    from .tasks import execute_call

    for call in sent:
        transaction.on_commit(functools.partial(execute_call.delay, str(call.pk)), robust=True)
    session_id = str(calls[0].session_id)
    for call in calls:
        change = (str(call.pk), session_id, str(call.status), Status.RECEIVED)
        transaction.on_commit(functools.partial(notify.publish_change, *change))


def _repeat_counts(session: AgentSession, keys: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """How many calls of the session had each (tool, digest) before: one query per message."""
    excluded = settings.HARNESS_REPEAT_EXCLUDED_TOOLS
    digests = {digest for name, digest in keys if name not in excluded}
    if not digests:
        return {}
    rows = (
        ToolCall.objects.filter(session=session, digest__in=digests)
        .order_by()
        .values_list("name", "digest")
        .annotate(n=Count("pk"))
    )
    return {(name, digest): n for name, digest, n in rows}


def receive(
    session: AgentSession,
    dialect: str,
    item: ProposedCall,
    digest: str,
    batch_id: uuid.UUID,
    index: int,
    counts: dict[tuple[str, str], int],
    admission: _Admission,
) -> ToolCall:
    """Stage 1, receive: the call with its exact arguments and digest, and its call.received."""
    repeat_count = 1
    if item.name not in settings.HARNESS_REPEAT_EXCLUDED_TOOLS:
        key = (item.name, digest)
        counts[key] = counts.get(key, 0) + 1  # counts this one for the rest of the message
        repeat_count = counts[key]
    call = ToolCall(
        id=uuid.uuid4(),
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
    admission.calls.append(call)
    admission.events.append(
        EventSpec(
            "call.received",
            f"agent:{session.agent.name}",
            f"call:{call.pk}",
            {
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
            timezone.now(),
        )
    )
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
        may_have_grants=getattr(session, "has_grants", True),
    )


def _decide(
    call: ToolCall,
    item: ProposedCall,
    session: AgentSession,
    mode: str,
    profile: Profile,
    admission: _Admission,
) -> EventSpec:
    """Stages 2 to 5: resolve, validate, pre_execute, guards; then the transition they
    chose, applied to the new call in memory. Returns the decision's audit event."""
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
        text = messages.policy_denied(decision.reason)
        return _settle(call, Status.DENIED, decision, "call.denied", text)
    if decision.action == "cancel":
        text = messages.cancelled(decision.by, decision.reason)
        return _settle(call, Status.CANCELLED, decision, "call.cancelled", text)
    denials = pipeline.guards(ctx)
    if denials:
        guard = Decision(
            "deny", "guard:" + ",".join(n for n, _ in denials), " ".join(r for _, r in denials)
        )
        text = messages.guard_denied([r for _, r in denials])
        return _settle(call, Status.DENIED, guard, "call.denied", text)
    provenance = {**call.provenance, **decision.as_provenance()}
    if decision.action == "ask":
        presentation = tool.present_call(call.arguments or {}, ctx.workspace)
        admission.asks.append((call, presentation))
        return _new_transition(
            call,
            Status.PENDING_APPROVAL,
            kind="call.approval_requested",
            actor=decision.by,
            payload={**provenance, "presentation": presentation},
            **_decision_fields(call, decision),
        )
    return _new_transition(
        call,
        Status.QUEUED,
        kind="call.allowed",
        actor=decision.by,
        payload=provenance,
        queued_at=timezone.now(),
        **_decision_fields(call, decision),
    )


def _new_transition(
    call: ToolCall, to: Status, *, kind: str, actor: str, payload: dict[str, Any], **fields: Any
) -> EventSpec:
    """A transition of a call not yet written (admission writes it in its decided state)."""
    _check_transition(call, to, fields)
    # Timed now, when it is decided: the append comes later, for the whole message.
    return _apply(
        call, to, kind=kind, actor=actor, payload=payload, fields=fields, at=timezone.now()
    )


def _reject(call: ToolCall, reason: str, stage: str) -> EventSpec:
    decision = Decision("deny", f"stage:{stage}", reason)
    fields = _decision_fields(call, decision, reason)
    fields["decision"] = "reject"
    return _new_transition(
        call,
        Status.REJECTED,
        kind="call.rejected",
        actor="harness",
        payload={"stage": stage, "reason": reason},
        **fields,
    )


def _settle(call: ToolCall, to: Status, decision: Decision, kind: str, text: str) -> EventSpec:
    return _new_transition(
        call,
        to,
        kind=kind,
        actor=decision.by,
        payload={**call.provenance, **decision.as_provenance()},
        **_decision_fields(call, decision, text),
    )


# --- Decisions on pending calls (reviewers, expiry, the agent) ---------------------------


def _decide_pending(
    call_id: uuid.UUID | str,
    to: Status,
    decision: Decision,
    kind: str,
    text: str | None,
    extra: dict[str, Any] | None = None,
    call: ToolCall | None = None,
    **fields: Any,
) -> bool:
    """Close a pending call as `to`: check it is still pending, transition (a conditional
    update: exactly one decision wins), and send what may run next in its batch (after
    commit). False if it was no longer pending.

    Joins the caller's transaction when there is one (the approvals app records its own
    row in the same commit, and passes the `call` it read under its approval's lock).
    """
    with transaction.atomic():
        if call is None:
            call = ToolCall.objects.select_for_update().get(pk=call_id)
        if call.status != Status.PENDING_APPROVAL:
            return False
        done = transition(
            call,
            to,
            kind=kind,
            actor=decision.by,
            payload={**decision.as_provenance(), **(extra or {})},
            publish=False,
            **fields,
            **_decision_fields(call, decision, text),
        )
        if done:
            from .execution import dispatch_ready

            # In the same transaction (one commit); the messages still leave after it,
            # the worker's first, then the pushes to agents and reviewers.
            dispatch_ready(call.batch_id)
            publish_after_commit(call, Status.PENDING_APPROVAL)
        return done


def approve_call(
    *,
    call_id: uuid.UUID | str,
    actor: str,
    reason: str = "",
    extra: dict[str, Any] | None = None,
    call: ToolCall | None = None,
) -> bool:
    """Approve a pending call; it is queued to run. False if it was no longer pending."""
    decision = Decision("allow", actor, reason or "Approved by a reviewer.")
    return _decide_pending(
        call_id,
        Status.QUEUED,
        decision,
        "call.approved",
        None,
        extra,
        call=call,
        queued_at=timezone.now(),
    )


def deny_call(
    *,
    call_id: uuid.UUID | str,
    actor: str,
    reviewer: str,
    feedback: str = "",
    extra: dict[str, Any] | None = None,
    call: ToolCall | None = None,
) -> bool:
    """Deny a pending call; `feedback` reaches the model as the tool result."""
    decision = Decision("deny", actor, feedback or "Denied by a reviewer.")
    text = messages.reviewer_denied(reviewer, feedback)
    return _decide_pending(call_id, Status.DENIED, decision, "call.denied", text, extra, call=call)


def cancel_call(*, call_id: uuid.UUID | str, actor: str, reason: str = "") -> bool:
    decision = Decision("cancel", actor, reason or "Cancelled.")
    text = messages.cancelled(actor, reason)
    return _decide_pending(call_id, Status.CANCELLED, decision, "call.cancelled", text)


def expire_call(*, call_id: uuid.UUID | str, minutes: float) -> bool:
    decision = Decision("deny", "expiry", f"No decision within {minutes:g} minutes.")
    text = messages.expired(minutes)
    return _decide_pending(call_id, Status.EXPIRED, decision, "call.expired", text)
