"""Every state change of a call after admission: one function per transition.

Each is one conditional update plus its audit event in one transaction (`transition`);
the wake-ups and the workers' messages leave after commit. Who calls what: admission
writes new calls in their decided state (`new_transition`); reviewers, expiry and the
agent close pending calls (`approve_call`, `deny_call`, `expire_call`, `cancel_call`);
the worker claims, finishes or denies before running (`claim`, `finish`,
`deny_before_run`); the reconciler ends lost leases (`mark_outcome_unknown`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone

from audit import kinds
from audit.services import EventSpec, record_events, write_and_lock_head
from dispatcher import batches, wakeups
from dispatcher.models import (
    TERMINAL_STATUSES,
    TRANSITIONS,
    Agent,
    AgentSession,
    Executor,
    Status,
    ToolCall,
)
from dispatcher.policy.context import Decision
from dispatcher.policy.stages import GuardDenial
from dispatcher.tools import messages
from dispatcher.tools.base import Tool
from floor import compiled
from floor.compiled import Compiled
from floor.errors import ServiceError


def transition(
    call: ToolCall,
    to: Status,
    *,
    kind: str,
    actor: str,
    payload: dict[str, Any],
    publish: bool = True,
    live: bool = False,
    hold_credential: bool = False,
    **fields: Any,
) -> bool:
    """Move `call` from its current status to `to`: one conditional update plus its audit event.

    Returns False (and changes nothing) if another process moved the call first. Must run
    inside transaction.atomic(); the wake-up is published after commit (`publish=False`:
    the caller schedules it with publish_after_commit). `live`: the update is conditional
    on the credential that sent the call being live too (`live_credential`), in its own
    WHERE: False (nothing written) when it is not. `hold_credential` (with `live`): the
    agent's row is held FOR KEY SHARE to the commit (`live_credential_sql(hold=True)`).
    """
    _check_transition(call, to, fields)
    previous = call.status
    values = {"status": to, **fields}
    statement = _update_statement(call.pk, previous, values)
    if statement is not None and live:
        sql, params = statement
        condition = live_credential_sql(hold=hold_credential)
        statement = f"{sql} AND {condition}", [*params, *live_credential_params(call)]
    if statement is None:  # (a relation or an expression: the ORM's UPDATE, then the lock)
        assert not live, "a live claim is one statement"
        moved = ToolCall.objects.filter(pk=call.pk, status=previous).update(**values)
        head = None
    else:  # the conditional UPDATE and the chain head's lock in one statement
        moved, head = write_and_lock_head(*statement, session_id=call.session_id)
    if not moved:
        return False
    spec = _apply(call, to, kind=kind, actor=actor, payload=payload, fields=fields, at=None)
    # Timed under the chain lock.
    record_events([spec], session_id=call.session_id, locked_head=head)
    if publish:
        publish_after_commit(call, previous)
    return True


def _update_statement(
    pk: uuid.UUID, previous: str, values: dict[str, Any]
) -> tuple[str, list[Any]] | None:
    """`UPDATE ... SET <values> WHERE id = pk AND status = previous`, with its parameters;
    None when a value is a relation or an expression (the ORM compiles those).

    What `ToolCall.objects.filter(pk=pk, status=previous).update(**values)` sends, with the
    statement's text built once per set of columns (building and compiling the ORM's
    UPDATE cost more CPU per transition than the statement itself: docs/benchmarks.md).
    """
    names = tuple(values)
    if any(name not in _FIELDS or _FIELDS[name].is_relation for name in names) or any(
        hasattr(value, "resolve_expression") for value in values.values()
    ):
        return None
    columns = [_FIELDS[name].column for name in names]
    sql = compiled.update_sql(ToolCall, columns, [_FIELDS["id"].column, _FIELDS["status"].column])
    db = connections[DEFAULT_DB_ALIAS]  # (once: each use of the `connection` proxy is a lookup)
    params = [_BINDERS[name](values[name], db) for name in names]
    params += [_BINDERS["id"](pk, db), _BINDERS["status"](previous, db)]
    return sql, params


def live_credential_sql(*, hold: bool = False) -> str:
    """An SQL condition (its parameters: `live_credential_params`): the credential a call
    was sent with is still live, read in the statement that carries it. Its session is not
    left and is of its agent's team (a move, `agents.transfer_agent`); its agent is active
    (a revocation), its bearer token not voided (a holder's leaving), and the token prefix
    the admission read with the verified token is still the agent's (a rotation; a
    sign-out gives a signed-in agent a new one: `agents._new_sign_in`). A call sent with
    an OAuth access token names its sign-in too (provenance "sign_in": the token's
    refresh-token family, which a refresh keeps): that sign-in must still hold an
    unrevoked refresh token bound to an access token (a revocation of that one token,
    RFC 7009, ends it; the agent's other sign-ins are untouched). What
    `agents.credential_refusal` refuses, as the rows are at the statement's start (a call
    admitted before Harness recorded the prefix is checked without it, as `token_refusal`
    does).

    `hold` (the worker's claim, PostgreSQL): the agent's row is locked FOR KEY SHARE by
    the condition, to the claim's commit. Every step that kills an agent's credential
    locks that row FOR UPDATE before it writes it (a sign-out, a revocation, a rotation,
    a void, a move), so it waits for a claim in flight, and a claim that reaches the row
    while such a step holds it waits for its commit and reads the row as committed
    (READ COMMITTED's re-check of a locked row): a claim whose statement began before the
    step committed no longer runs the call after it. FOR KEY SHARE conflicts with FOR
    UPDATE only: a session's start or any other update of the row never waits for it.
    The sign-in's live refresh token is held FOR KEY SHARE too: a revocation of that one
    token (RFC 7009, which locks it FOR UPDATE and writes no row of the agent's) waits for
    a claim in flight, and a claim that reaches it after the revocation reads it revoked
    (a claim whose snapshot predated the revocation ran the call after it). A refresh
    racing such a claim revokes the row too (its successor, written after the claim's
    snapshot, is not seen): the claim then finds the call's credential live at a fresh
    read and is tried once more (execution._claim_and_run)."""
    vendor = connections[DEFAULT_DB_ALIAS].vendor
    key = (vendor, hold and vendor == "postgresql")
    sql = _LIVE_SQL.get(key)
    if sql is None:
        sql = _LIVE_SQL[key] = _live_sql(vendor, locked=key[1])
    return sql


def _live_sql(vendor: str, *, locked: bool) -> str:
    q = connections[DEFAULT_DB_ALIAS].ops.quote_name

    def col(model: Any, name: str) -> str:
        return q(str(model._meta.get_field(name).column))

    tokens = apps.get_model(settings.OAUTH2_PROVIDER_REFRESH_TOKEN_MODEL)
    family = "CAST(%s AS uuid)" if vendor == "postgresql" else "%s"
    agent = (
        f"FROM {q(AgentSession._meta.db_table)} live_s "  # noqa: S608
        f"INNER JOIN {q(Agent._meta.db_table)} live_a "
        f"ON live_a.{col(Agent, 'id')} = live_s.{col(AgentSession, 'agent')} "
        f"WHERE live_s.{col(AgentSession, 'id')} = %s "
        f"AND live_s.{col(AgentSession, 'left_at')} IS NULL "
        f"AND live_s.{col(AgentSession, 'team')} = live_a.{col(Agent, 'team')} "
        f"AND live_a.{col(Agent, 'is_active')} = %s "
        f"AND live_a.{col(Agent, 'token_voided_at')} IS NULL "
        f"AND live_a.{col(Agent, 'token_prefix')} = "
        f"COALESCE(%s, live_a.{col(Agent, 'token_prefix')})"
    )
    sign_in = (
        f"({family} IS NULL OR EXISTS (SELECT 1 FROM {q(tokens._meta.db_table)} live_t "  # noqa: S608
        f"WHERE live_t.{col(tokens, 'token_family')} = {family} "
        f"AND live_t.{col(tokens, 'revoked')} IS NULL "
        f"AND live_t.{col(tokens, 'access_token')} IS NOT NULL"
        f"{' FOR KEY SHARE' if locked else ''}))"
    )
    if not locked:
        return f"EXISTS (SELECT 1 {agent} AND {sign_in})"
    # The agent's row locked first, then the refresh token's (the order every killing
    # step takes: a sign-out locks the agent, then revokes its tokens). In one WHERE,
    # PostgreSQL locked the refresh token (a condition's subquery) before the agent's row
    # (the query's own lock): a claim and a sign-out deadlocked. A materialized CTE is
    # read, and its row locked, before the outer condition runs.
    return (
        f"EXISTS (WITH live_c AS MATERIALIZED (SELECT 1 {agent} FOR KEY SHARE OF live_a) "  # noqa: S608
        f"SELECT 1 FROM live_c WHERE {sign_in})"
    )


_LIVE_SQL: dict[tuple[str, bool], str] = {}


def live_credential_params(call: ToolCall) -> list[Any]:
    """The parameters of `live_credential_sql` for `call`: its session, the token prefix
    its admission recorded (None: admitted before Harness kept it), and the OAuth sign-in
    it was sent under (None: sent with a bearer token)."""
    provenance = call.provenance or {}
    db = connections[DEFAULT_DB_ALIAS]
    sign_in = _sign_in_binder(provenance.get("sign_in"), db)
    return [
        _BINDERS["session"](call.session_id, db),
        True,
        provenance.get("token"),
        sign_in,
        sign_in,
    ]


def _sign_in_binder(value: Any, db: Any) -> Any:
    if value is None:
        return None
    family = uuid.UUID(str(value))
    return family if db.vendor == "postgresql" else family.hex


# The call's concrete fields by name.
_FIELDS: dict[str, Any] = {f.name: f for f in ToolCall._meta.concrete_fields}
# Their values as the ORM binds them (floor.compiled.binder).
_BINDERS = {name: compiled.binder(f) for name, f in _FIELDS.items()}


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
    transaction.on_commit(lambda: wakeups.publish_change(call_id, session_id, to, previous))


def _finish_text(call: ToolCall, text: str) -> str:
    return text + messages.repeat_reminder(call.repeat_count, call.name, call.raw_arguments)


def decision_fields(
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


def new_transition(
    call: ToolCall, to: Status, *, kind: str, actor: str, payload: dict[str, Any], **fields: Any
) -> EventSpec:
    """A transition of a call not yet written (admission writes it in its decided state)."""
    _check_transition(call, to, fields)
    # Timed now, when it is decided: the append comes later, for the whole message.
    return _apply(
        call, to, kind=kind, actor=actor, payload=payload, fields=fields, at=timezone.now()
    )


def _decide_pending(
    call_id: uuid.UUID | str,
    to: Status,
    decision: Decision,
    kind: str,
    text: str | None,
    extra: dict[str, Any] | None = None,
    call: ToolCall | None = None,
    live: bool = False,
    hold: bool = False,
    **fields: Any,
) -> bool:
    """Close a pending call as `to`: check it is still pending, transition (a conditional
    update: exactly one decision wins), and send what may run next in its batch (after
    commit). False if it was no longer pending (`live`: or its credential is dead, the
    update conditional on it too: `transition`; `hold`: its rows held, `hold_credential`).

    Joins the caller's transaction when there is one (the approvals app records its own
    row in the same commit, and passes the `call` it read under its approval's lock),
    without a savepoint: a failure here fails the whole decision.

    The only call of its batch, queued: its message is marked sent in the transition
    itself (`approve_call`), and nothing else of the batch is read.
    """
    with transaction.atomic(savepoint=False):
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
            live=live,
            hold_credential=hold,
            **fields,
            **decision_fields(call, decision, text),
        )
        if done:
            # In the same transaction (one commit); the messages still leave after it,
            # the worker's first, then the pushes to agents and reviewers.
            batches.dispatch_decided(call)
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
    """Approve a pending call: queued for a worker, or released to the client that runs
    it (decide-only). False if it was no longer pending."""
    decision = Decision("allow", actor, reason or "Approved by a reviewer.")
    with transaction.atomic(savepoint=False):
        if call is None:
            call = ToolCall.objects.select_for_update().get(pk=call_id)
        if call.executor == Executor.CLIENT:
            to, fields = Status.RELEASED, release_fields()
        else:
            now = timezone.now()
            to, fields = Status.QUEUED, {"queued_at": now}
            if call.batch_size == 1:  # the batch's only call: its message leaves now
                fields["enqueued_at"] = now
        return _release_approved(call, to, decision, extra, fields)


def _release_approved(
    call: ToolCall,
    to: Status,
    decision: Decision,
    extra: dict[str, Any] | None,
    fields: dict[str, Any],
) -> bool:
    """An approved call released (`to`): to its client, which runs it with no check after
    (decide-only), or queued for a worker: only while the credential that sent it is
    live, in the release's own UPDATE (`live_credential_sql`, as the worker's claim). The
    decision read the agent before (approvals: its token, the guards); a rotation or a
    revocation of a bearer agent takes no row the decision holds and may commit in
    between. A release that finds it dead, the call still pending, denies it at the
    release instead (`deny_at_release`, guard token: the hook waiting with that credential
    is answered "deny"; the call is DENIED in memory, as its decision's caller reads it).
    One read more, on that miss only; False when the call was no longer pending.

    The release holds the credential's rows as the worker's claim does (`hold`:
    `live_credential_sql(hold=True)`, the agent's row FOR KEY SHARE, then its sign-in's
    live refresh token): its statement reads the credential, then may wait (for its
    session chain's head), and a sign-out or a one-token revocation committing meanwhile
    released a hook's call to its client after it ("allow"). Now such a step waits for the
    release, or the release waits for it and refuses the call. The decision took the
    agent's row first, before the approval's (approvals.services._LOCKED_REQUEST), the
    order a deactivation takes them. A release that lost only to a refresh of the call's
    sign-in (its token revoked, the successor written after the statement's snapshot) is
    tried once more when a fresh read finds the credential live (`_renewed`)."""
    for attempt in (1, 2):
        if _decide_pending(
            call.pk,
            to,
            decision,
            kinds.CALL_APPROVED,
            None,
            extra,
            call=call,
            live=True,
            hold=True,
            **fields,
        ):
            return True
        if not ToolCall.objects.filter(pk=call.pk, status=Status.PENDING_APPROVAL).exists():
            return False  # another decision, a cancel, moved it first
        if attempt == 2 or not _renewed(call):
            break
    gone = messages.credential_gone(call.session.agent.name)
    return deny_at_release(call=call, denial=GuardDenial(((TOKEN_GUARD, gone),)), extra=extra)


def _renewed(call: ToolCall) -> bool:
    """After a held write conditional on `call`'s credential that wrote nothing: whether
    the call was sent under an OAuth sign-in that a fresh read finds live (a refresh
    committed while the write waited, not a revocation or a sign-out). One statement."""
    return bool((call.provenance or {}).get("sign_in")) and credential_live_now(call)


def credential_live_now(call: ToolCall) -> bool:
    """Whether `call`'s credential is live at a read of its own (`live_credential_sql`,
    nothing held). One statement."""
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute(f"SELECT 1 WHERE {live_credential_sql()}", live_credential_params(call))
        return cursor.fetchone() is not None


# The guard a call sent with a credential that no longer acts for its agent is denied by
# (agents.TOKEN_GUARD).
TOKEN_GUARD = "token"


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
    return _decide_pending(
        call_id, Status.DENIED, decision, kinds.CALL_DENIED, text, extra, call=call
    )


def deny_at_release(
    *, call: ToolCall, denial: GuardDenial, extra: dict[str, Any] | None = None
) -> bool:
    """A reviewer approved a pending call its client runs (decide-only), and the guards,
    re-run at that moment, deny it (the agent revoked, the mode locked while it waited):
    it ends denied, never released; the worker's re-check (`deny_before_run`) for a call
    no worker runs. False if it was no longer pending."""
    payload = {**(extra or {}), "stage": "release"}
    return _decide_pending(
        call.pk,
        Status.DENIED,
        denial.decision,
        kinds.CALL_DENIED,
        denial.message,
        payload,
        call=call,
    )


def cancel_call(*, call_id: uuid.UUID | str, actor: str, reason: str = "") -> bool:
    decision = Decision("cancel", actor, reason or "Cancelled.")
    text = messages.cancelled(actor, reason)
    return _decide_pending(call_id, Status.CANCELLED, decision, kinds.CALL_CANCELLED, text)


def expire_call(*, call_id: uuid.UUID | str, minutes: float) -> bool:
    decision = Decision("deny", "expiry", f"No decision within {minutes:g} minutes.")
    text = messages.expired(minutes)
    return _decide_pending(call_id, Status.EXPIRED, decision, kinds.CALL_EXPIRED, text)


def edit_call(
    *,
    call_id: uuid.UUID | str,
    actor: str,
    reviewer: str,
    replacement: str,
    arguments_json: str,
    extra: dict[str, Any] | None = None,
    call: ToolCall | None = None,
) -> bool:
    """A reviewer changed a pending call's arguments: it ends `edited`, and its content
    is the note the model reads (what runs instead, as call `replacement`, the new
    call's tool_use_id). False if it was no longer pending.

    The caller admits the replacement in the same transaction, in the original's place
    in its batch (admission dispatches the batch then), so nothing of the batch starts
    in between.
    """
    decision = Decision("deny", actor, f"Edited by {reviewer}: replaced by {replacement}.")
    with transaction.atomic():
        if call is None:
            call = ToolCall.objects.select_for_update().get(pk=call_id)
        if call.status != Status.PENDING_APPROVAL:
            return False
        fields = decision_fields(call, decision)
        fields["decision"] = "edit"
        fields["provenance"] = {**fields["provenance"], "action": "edit"}
        done = transition(
            call,
            Status.EDITED,
            kind=kinds.CALL_EDITED,
            actor=actor,
            payload={
                **decision.as_provenance(),
                "action": "edit",
                "replacement": replacement,
                "arguments": arguments_json,
                **(extra or {}),
            },
            content=messages.edited(reviewer, call.name, replacement, arguments_json),
            is_error=False,
            **fields,
        )
        return done


def repreview_call(
    *,
    call: ToolCall,
    replacement: str,
    reason: str,
    digests: dict[str, str],
    diff: bool = False,
) -> bool:
    """The workspace changed between the preview a reviewer approved and its apply: the
    queued call ends `edited` (nothing applied, nothing run), and its content is the note
    the model reads; the caller admits `replacement` (the new call's tool_use_id), which
    is previewed again and asks again. False if the call was no longer queued."""
    decision = Decision("deny", "harness:preview", f"Previewed again: {reason}.")
    with transaction.atomic():
        fields = decision_fields(call, decision)
        fields["decision"] = "repreview"
        fields["provenance"] = {**call.provenance, "action": "repreview"}
        return transition(
            call,
            Status.EDITED,
            kind=kinds.CALL_REPREVIEWED,
            actor="harness:preview",
            payload={"reason": reason, "replacement": replacement, **digests},
            content=messages.repreviewed(call.name, replacement, reason, diff=diff),
            is_error=False,
            **fields,
        )


def deny_before_run(call: ToolCall, denial: GuardDenial) -> None:
    """The worker's re-check of the guards denied a queued call: it ends denied, unrun."""
    decision = denial.decision
    content = _finish_text(call, denial.message)
    with transaction.atomic():
        transition(
            call,
            Status.DENIED,
            kind=kinds.CALL_DENIED,
            actor=decision.by,
            payload={**decision.as_provenance(), "stage": "execute"},
            decision="deny",
            decided_by=decision.by,
            reason=decision.reason,
            provenance={**call.provenance, "recheck": decision.as_provenance()},
            content=content,
            is_error=True,
        )
    batches.dispatch_after(call)


def claim(
    call: ToolCall,
    tool: Tool,
    *,
    leased_from: datetime | None = None,
    confirm: Callable[[], bool] | None = None,
) -> bool:
    """The one conditional update that lets exactly one worker run the call.

    `leased_from`: when the call's lease starts, if before now (the worker reads the
    clock before it moves its owner's place to lapse with the lease, `batches.hold`, so
    that the place never lapses before the lease does, however long the claim waited
    for the database).

    `confirm`: asked after the update, before the commit; false rolls the claim back
    (False, the call still queued): the worker's place among its owner's running calls
    is still counted (`batches.kept_since_hold`).

    The update is conditional on the credential that sent the call being live as well
    (`live_credential_sql`, in its WHERE: no statement more): a sign-out, a revocation,
    a void, a rotation or a move that committed before the claim's statement began leaves
    the call queued and this False; the caller ends it (execution.refuse_dead_credential).
    The condition holds the agent's row FOR KEY SHARE to the commit (`hold_credential`),
    which each of those steps locks FOR UPDATE first: one that commits while this claim
    waits (on its call's row, say) waits for it instead, or this waits for it and reads
    the row as it committed.

    Publishes nothing: the worker announces the call as running only if its body is
    still running a moment later (`announce_running`, pipeline.execute's
    `while_running`). For most calls the next wake-up, the result's, follows within a
    millisecond or two, and a wake-up in between would only cost a Redis round trip on
    the worker's path: no waiting agent reads on "running", and a timeline open on the
    session shows the claim's event with the result's.
    """
    now = timezone.now()
    previous = (call.status, call.started_at, call.attempts, call.lease_until)
    try:
        with transaction.atomic():
            claimed = transition(
                call,
                Status.RUNNING,
                kind=kinds.CALL_STARTED,
                actor="worker",
                payload={"attempt": call.attempts + 1, "timeout": tool.timeout},
                publish=False,
                live=True,
                hold_credential=True,
                started_at=now,
                attempts=call.attempts + 1,
                lease_until=(leased_from or now)
                + timedelta(seconds=tool.timeout + settings.HARNESS_LEASE_GRACE),
            )
            if claimed and confirm is not None and not confirm():
                raise _NotConfirmed
            return claimed
    except _NotConfirmed:
        call.status, call.started_at, call.attempts, call.lease_until = previous
        return False


class _NotConfirmed(Exception):
    """A claim's `confirm` said no: its transaction is rolled back."""


def claim_new(call: ToolCall, tool: Tool) -> EventSpec:
    """The claim of a call not yet written, applied in memory: admission writes a call
    the request runs itself (execution.run_inline, run_body_async) already running, with this event after
    its decision's in the same commit, so the claim is durable before the tool runs."""
    now = timezone.now()
    return new_transition(
        call,
        Status.RUNNING,
        kind=kinds.CALL_STARTED,
        actor="inline",
        payload={"attempt": call.attempts + 1, "timeout": tool.timeout},
        started_at=now,
        attempts=call.attempts + 1,
        lease_until=now + timedelta(seconds=tool.timeout + settings.HARNESS_LEASE_GRACE),
    )


def announce_running(call: ToolCall, previous: Status) -> None:
    """The claimed call's wake-up (it was committed running by `claim`, or by its
    admission for an inline call: `previous` RECEIVED, its first wake-up)."""
    wakeups.publish_change(str(call.pk), str(call.session_id), Status.RUNNING, previous)


def finish(
    call: ToolCall,
    status: Status,
    content: str,
    is_error: bool,
    seconds: float,
    *,
    audit: dict[str, Any] | None = None,
) -> None:
    """Stage 10: freeze the result, audit it, deliver it (wake-up after commit), start what
    is next. `audit`: more for the result's event (a previewed effect applied or run)."""
    kind = kinds.CALL_COMPLETED if status == Status.COMPLETED else kinds.CALL_TIMED_OUT
    with transaction.atomic():
        transition(
            call,
            status,
            kind=kind,
            actor="worker",
            payload={
                "is_error": is_error,
                "content": content,
                "seconds": round(seconds, 4),
                **(audit or {}),
            },
            content=content,
            is_error=is_error,
            timings={**call.timings, "execute_s": round(seconds, 4)},
        )
    batches.dispatch_after(call)


def mark_outcome_unknown(call: ToolCall) -> bool:
    """A running call whose worker's lease expired: its outcome cannot be known."""
    with transaction.atomic():
        done = transition(
            call,
            Status.OUTCOME_UNKNOWN,
            kind=kinds.CALL_OUTCOME_UNKNOWN,
            actor="reconciler",
            payload={"lease_until": call.lease_until.isoformat() if call.lease_until else None},
            content=messages.outcome_unknown(),
            is_error=True,
            reason="The worker's lease expired before it reported a result.",
        )
    batches.dispatch_after(call)
    return done


# --- Decide-only calls (the client runs the tool) -----------------------------------------


def release_fields() -> dict[str, Any]:
    """A released call's lease: the client has this long to report what the tool did."""
    now = timezone.now()
    return {
        "queued_at": now,
        "lease_until": now + timedelta(seconds=settings.HARNESS_CLIENT_REPORT_LEASE),
    }


def report_result(
    *,
    call_id: uuid.UUID | str,
    content: str,
    is_error: bool,
    actor: str,
    source: str,
    extra: dict[str, Any] | None = None,
) -> bool:
    """The client's report of what a released call's tool returned: the call's result,
    marked as reported by the client (`source`, e.g. "claude-code:PostToolUse"), never as
    produced by Harness. False if the call was not released (reported already, lease
    passed, or never allowed): a report never changes a finished call. `extra` joins the
    event's payload (e.g. whether the input the client reports is the one it was allowed)."""
    try:
        pk = uuid.UUID(str(call_id))
    except ValueError:  # not a call's id: no call to report on
        return False
    with transaction.atomic():
        call = _LOCKED_CALL.first(pk)
        if call is None or call.status != Status.RELEASED:
            return False
        return transition(
            call,
            Status.REPORTED,
            kind=kinds.CALL_REPORTED,
            actor=actor,
            payload={
                "content": content,
                "is_error": is_error,
                "reported_by": source,
                **(extra or {}),
            },
            content=content,
            is_error=is_error,
            provenance={**call.provenance, "result": {"reported_by": source}},
        )


# Read and locked by every client report (floor.compiled).
_LOCKED_CALL = Compiled(lambda pk: ToolCall.objects.select_for_update().filter(pk=pk)[:1])


def mark_unreported(call: ToolCall) -> bool:
    """A released call whose report never came within its lease: its outcome is the
    client's, and unknown here (never "completed")."""
    with transaction.atomic():
        return transition(
            call,
            Status.UNREPORTED,
            kind=kinds.CALL_UNREPORTED,
            actor="reconciler",
            payload={"lease_until": call.lease_until.isoformat() if call.lease_until else None},
            reason="The client did not report the tool's result within the lease.",
        )
