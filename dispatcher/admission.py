"""Admission, stages 1 to 5, in the web process: receive, resolve, validate, pre-execute,
guards. `submit_calls` is the one entry point; `_decide` runs stages 2 to 5 in order.

Stages 1 to 5 run in memory, and the message's calls are then written in their decided
state with their call.received and decision events, in one transaction: the log shows
each call received before it was decided, and nothing is decided without its record. So
pre_execute listeners and guards see a call only through its CallContext: at admission
its row is not in the database yet (neither are the earlier calls of the same message).
Guards run again in the worker, where the row exists.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Count
from django.utils import timezone
from django.utils.module_loading import import_string

from audit import kinds
from audit.masking import premask_arguments
from audit.models import AuditChain
from audit.services import EventSpec, record_events, write_and_lock_head
from dispatcher import batches, limits, previews, wakeups
from dispatcher.agents import mode_and_profile, refusal_since
from dispatcher.models import AgentSession, Executor, Status, ToolCall
from dispatcher.policy import layers, stages
from dispatcher.policy.context import CallContext, Decision, Profile
from dispatcher.policy.stages import GuardDenial
from dispatcher.proposals import ProposedCall, digest_of
from dispatcher.tools import messages
from dispatcher.tools.registry import get_tool, one_generation
from dispatcher.tools.sources import catalog
from dispatcher.transitions import (
    claim_new,
    credential_live_now,
    decision_fields,
    live_credential_params,
    live_credential_sql,
    new_transition,
    release_fields,
)
from floor import compiled
from floor.compiled import Compiled
from floor.errors import ServiceError

logger = logging.getLogger(__name__)


def submit_calls(
    *,
    session: AgentSession,
    dialect: str,
    proposed: list[ProposedCall],
    profile_preloaded: bool = False,
    place: tuple[uuid.UUID, int] | None = None,
) -> list[ToolCall]:
    """Admit one assistant message's calls; return them in request order.

    Idempotent by tool_use_id: a call already seen in the session is returned as it is,
    never created twice (also under concurrent submissions of the same message).
    `profile_preloaded`: see profile_for (the agent API reads it with the session).
    `place`: (batch id, index) where the calls stand instead of a new batch: a
    reviewer's edit puts its replacement where the original stood, so the batch keeps
    its order (the whole batch is then dispatched, not only the new calls).
    """
    calls, _ = admit_message(
        session=session,
        dialect=dialect,
        proposed=proposed,
        profile_preloaded=profile_preloaded,
        place=place,
    )
    return calls


def admit_message(
    *,
    session: AgentSession,
    dialect: str,
    proposed: list[ProposedCall],
    profile_preloaded: bool = False,
    place: tuple[uuid.UUID, int] | None = None,
    inline: bool = False,
) -> tuple[list[ToolCall], list[tuple[ToolCall, CallContext]]]:
    """`submit_calls`, and the calls this process keeps to run itself (`inline`: the
    request waits for its answer and runs it: execution.run_inline, or on its loop
    execution.run_body_async), each with what
    policy saw of it: a new call allowed at once that is the only call of its message,
    whose tool may run inline (`Tool.inline`). It is written claimed (running, its lease
    set, its call.started after its decision's event, in the same commit), and no Celery
    message is sent for it. If this process ends before its result is written, its
    lease ends it as outcome_unknown, as for a worker that died running it."""
    with one_generation():  # the message's upstream tools from one read
        return _admit_once(session, dialect, proposed, profile_preloaded, place, inline)


def _admit_once(
    session: AgentSession,
    dialect: str,
    proposed: list[ProposedCall],
    profile_preloaded: bool,
    place: tuple[uuid.UUID, int] | None,
    inline: bool,
) -> tuple[list[ToolCall], list[tuple[ToolCall, CallContext]]]:
    mode, profile = mode_and_profile(session, preloaded=profile_preloaded)
    look_up, refused, renewed = False, None, False
    while True:
        try:
            # Optimistic: a message's calls are almost always new, so the first attempt
            # does not look for them; the unique (session, tool_use_id) constraint catches
            # those that are not, and nothing of the attempt is kept.
            return _admit(
                session,
                dialect,
                proposed,
                mode,
                profile,
                place,
                look_up=look_up,
                inline=inline,
                refused=refused,
            )
        except IntegrityError:
            # A resubmitted message, or the same message submitted concurrently whose other
            # request won (one call per tool_use_id): admitting again finds its calls. Any
            # other integrity failure (an audit store refusing the write) is not ours to hide.
            ids = [p.tool_use_id for p in proposed]
            if (
                look_up
                or not ToolCall.objects.filter(session=session, tool_use_id__in=ids).exists()
            ):
                raise
            look_up = True
        except _CredentialDied:
            # The token was checked before a sign-out (a revocation, a void, a rotation, a
            # move) committed, and the write found it dead: nothing of the attempt is kept,
            # and the message is admitted again, each new call denied saying why.
            if refused is not None:
                raise
            if not renewed and _sign_in_renewed(session):
                renewed = True  # (once, as the worker's claim: execution._sign_in_renewed)
                continue
            refused = refusal_since(session)


def _sign_in_renewed(session: AgentSession) -> bool:
    """After a write that found the credential `session` was read with dead: whether it
    lost only to a refresh of its OAuth sign-in, and the message may be admitted once
    more. The write held the sign-in's refresh token (live_credential_sql(hold=True)); a
    refresh committing while it waited revoked that token and wrote its successor after
    the write's snapshot, so the write saw the sign-in ended. A fresh read finds it live
    under the new token: the sign-in lives on. A sign-out, a revocation of that token,
    or any other death is dead at this read too (refused then: `refusal_since`). Only for
    a request sent under a sign-in; one statement, on that miss only."""
    if getattr(session.agent, "sign_in", None) is None:
        return False
    probe = ToolCall(
        session_id=session.pk,
        provenance={"token": session.agent.token_prefix, "sign_in": str(session.agent.sign_in)},  # type: ignore[attr-defined]
    )
    return credential_live_now(probe)


class _CredentialDied(Exception):
    """A message's write that would let a call run with no check after it (claimed for
    the inline lane, released to its client) found its credential dead (`_insert_calls`)."""


@dataclass
class _Admission:
    """The new calls of one message, decided in memory, then written at once."""

    calls: list[ToolCall] = field(default_factory=list)
    events: list[EventSpec] = field(default_factory=list)
    asks: list[tuple[ToolCall, dict[str, Any]]] = field(default_factory=list)
    # Previews of asking commands (dispatcher.previews), written with their calls.
    previews: list[tuple[ToolCall, previews.Made]] = field(default_factory=list)
    # The audit copy of each call's raw arguments, masked before the transaction opens.
    masked_arguments: dict[str, str] = field(default_factory=dict)
    # Whether asks count against HARNESS_MAX_PENDING_ASKS_PER_AGENT (a reviewer's edit,
    # which replaces a pending call, does not), and the agent's pending calls when read.
    caps_asks: bool = True
    pending_asks: int | None = None
    # The calls this process runs itself (admit_message's `inline`), written claimed,
    # with what policy saw of each: no Celery message.
    kept: list[tuple[ToolCall, CallContext]] = field(default_factory=list)
    allowed: dict[uuid.UUID, CallContext] = field(default_factory=dict)
    # Why every new call is denied: its credential died while it was admitted (_admit_once).
    refused: GuardDenial | None = None


def _admit(
    session: AgentSession,
    dialect: str,
    proposed: list[ProposedCall],
    mode: str,
    profile: Profile,
    place: tuple[uuid.UUID, int] | None = None,
    *,
    look_up: bool,
    inline: bool = False,
    refused: GuardDenial | None = None,
) -> tuple[list[ToolCall], list[tuple[ToolCall, CallContext]]]:
    """The message's calls decided in memory, then one transaction (one commit) for the
    whole message: the calls are inserted already decided, with their call.received and
    decision events in one append (received first, timed when it was received), then the
    runnable ones are sent after commit.

    `look_up`: first read the calls of the message the session already has (they are
    returned as they are); without it, a known call makes the INSERT fail (IntegrityError).
    `refused`: every new call is denied so (its credential died while it was admitted)."""
    batch_id, first_index = place or (uuid.uuid4(), 0)
    masked: dict[str, str] = {
        p.tool_use_id: premask_arguments(p.raw_arguments, p.arguments) for p in proposed
    }
    # Stages 1 to 5 outside the transaction: they only read, and may take a while (a long
    # command read by the guards, a pattern matched against every rule), which must not
    # hold the database's write lock (SQLite) or a connection in a transaction.
    known: dict[str, ToolCall] = {}
    if look_up:
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
    admission = _Admission(masked_arguments=masked, caps_asks=place is None, refused=refused)
    calls = []
    for index, item in enumerate(proposed):
        call = known.get(item.tool_use_id)
        if call is None:  # new (a repeated id within one message is one call)
            digest = digests[item.tool_use_id]
            call = known[item.tool_use_id] = receive(
                session, dialect, item, digest, batch_id, first_index + index, counts, admission
            )
            admission.events.append(_decide(call, item, session, mode, profile, admission))
        calls.append(call)
    if place is None:
        for call in admission.calls:
            call.batch_size = len(admission.calls)
    if admission.calls:
        _write(admission, session.pk, batch_id, continuing=place is not None, inline=inline)
    return calls, admission.kept


def _write(
    admission: _Admission,
    session_id: uuid.UUID,
    batch_id: uuid.UUID,
    *,
    continuing: bool,
    inline: bool = False,
) -> None:
    """One transaction for the message's new calls: inserted already decided, their events
    appended (received first), the runnable ones planned for after commit and the asks
    recorded. `continuing`: the calls join a batch already sent (its next ready call goes)."""
    with transaction.atomic():
        sent = [] if continuing else batches.startable(admission.calls)
        now = timezone.now()
        for call in sent:
            call.enqueued_at = now
        if not continuing and batches.all_sent(admission.calls, sent):
            for call in admission.calls:
                call.batch_all_sent = True
        if inline and len(admission.calls) == 1 and sent:
            ctx = admission.allowed.get(sent[0].pk)
            if ctx is not None and ctx.tool.inline and sent[0].executor == Executor.HARNESS:
                # Claimed in this commit, after its decision: durable before it runs.
                admission.events.append(claim_new(sent[0], ctx.tool))
                admission.kept, sent = [(sent[0], ctx)], []
        # A call that runs with no check after this write (claimed for the inline lane,
        # released to its client) is written only while its credential is live.
        unchecked = [c for c in admission.calls if c.status in (Status.RUNNING, Status.RELEASED)]
        head = _insert_calls(admission.calls, session_id, live=unchecked[0] if unchecked else None)
        record_events(admission.events, session_id=session_id, locked_head=head)
        previews.record(admission.previews)
        if continuing:
            batches.dispatch_ready(batch_id, batches.agent_of(admission.calls[0]))
        _after_admission(admission.calls, sent, kept=[call for call, _ in admission.kept])
        # After the wake-ups are planned: what the recorder plans for after commit
        # (an ask's notifications) comes after the asks reach the open queues.
        if admission.asks:
            record_ask = ask_recorder()
            for call, presentation in admission.asks:
                record_ask(call=call, presentation=presentation)


def ask_recorder() -> Any:
    """settings.HARNESS_ASK_RECORDER, imported once per value (dispatcher.E013 checks it)."""
    return _import_recorder(settings.HARNESS_ASK_RECORDER)


@functools.cache
def _import_recorder(path: str) -> Any:
    return import_string(path)


def _insert_calls(
    calls: list[ToolCall], session_id: uuid.UUID, *, live: ToolCall | None = None
) -> AuditChain | None:
    """INSERT the message's calls and (PostgreSQL) lock the session chain's head in the same
    statement: the head for record_events, or None when it must lock it itself.

    `live`: a call of the message sent with the credential the request verified, which
    must still be live when they are written (transitions.live_credential_sql), else
    _CredentialDied (raised in the caller's transaction, which it rolls back). The token
    was checked when the request began; a sign-out that committed since is seen here. A
    message of one call (the inline lane, a hook's call) is written by one INSERT ...
    SELECT conditional on it: no statement more; any other checks it first, in one."""
    statement = compiled.insert_statement(calls)
    if live is not None and (statement is None or len(calls) > 1):
        _check_live(live)
        live = None
    if statement is None:
        compiled.insert(calls)  # (bulk_create's general case)
        return None
    sql, params = statement
    if live is not None:
        sql, params = _insert_if_live(sql), [*params, *live_credential_params(live)]
    # (prepared at once for one call; for more, at psycopg's count: see fixed_cursor)
    written, head = write_and_lock_head(
        sql, params, session_id=session_id, prepare=True if len(calls) == 1 else None
    )
    if live is not None and not written:
        raise _CredentialDied
    if written != len(calls):  # an INSERT writes every row or raises
        raise DatabaseError("the calls' INSERT did not write every call")
    compiled.inserted(calls)
    return head


@functools.cache
def _insert_if_live(sql: str) -> str:
    """A one-row `INSERT INTO t (...) VALUES (...)` as `INSERT INTO t (...) SELECT ...
    WHERE <the credential is live>` (PostgreSQL types each value by its column, as for
    VALUES)."""
    head, values = sql.split(" VALUES (", 1)
    assert values.endswith(")") and "), (" not in values, sql
    # Held as the worker's claim holds it (live_credential_sql(hold=True)): the statement
    # then waits for the chain's head, and a sign-out or a revocation committing meanwhile
    # must wait for this write (the call runs in the request, or its client runs it), not
    # let it through on the snapshot it read the credential with.
    return f"{head} SELECT {values[:-1]} WHERE {live_credential_sql(hold=True)}"


def _check_live(call: ToolCall) -> None:
    """_CredentialDied unless `call`'s credential is live (one statement), its rows held
    to the commit as `_insert_if_live` holds them: a sign-out or a revocation committing
    before the message's commit waits for it."""
    with connection.cursor() as cursor:
        sql = f"SELECT 1 WHERE {live_credential_sql(hold=True)}"
        cursor.execute(sql, live_credential_params(call))
        if cursor.fetchone() is None:
            raise _CredentialDied


def _after_admission(calls: list[ToolCall], sent: list[ToolCall], kept: Sequence[ToolCall]) -> None:
    """After commit: the workers' messages first, then the wake-ups and pushes. A message
    the broker refuses is logged and left to the reconciler (the call stays queued).

    A call this process keeps to run (`kept`, claimed) wakes nobody now: as a worker's
    claim, it is announced as running only if its body is still running a moment later
    (execution.run_inline, execution.run_body_async), and its result's wake-up follows (one Redis round trip less
    for a call that ends within that moment, the usual one; nobody waits on a call
    another request is answering).

    The wake-ups are robust hooks: one whose receiver raises is logged, and the hooks
    planned after it (an ask's notifications: see _admit) still run."""
    for call in sent:
        batches.enqueue_after_commit(str(call.pk), batches.agent_of(call))
    session_id = str(calls[0].session_id)
    for call in calls:
        if call in kept:
            continue
        change = (str(call.pk), session_id, str(call.status), Status.RECEIVED)
        transaction.on_commit(functools.partial(wakeups.publish_change, *change), robust=True)


def _repeat_counts(session: AgentSession, keys: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """How many calls of the session had each (tool, digest) before: one query per message,
    which also reads the upstream tools' generation for the message's lookups
    (`catalog.pin`: the read `one_generation` would otherwise make at the first lookup)."""
    excluded = settings.HARNESS_REPEAT_EXCLUDED_TOOLS
    digests = sorted({digest for name, digest in keys if name not in excluded})
    if not digests:
        return {}
    session_id = _SESSION_FIELD.get_db_prep_value(session.pk, connection)
    sql = _repeats_sql(connection.vendor, len(digests))
    try:
        # (prepared at once for one digest; for more, at psycopg's count: fixed_cursor)
        with compiled.fixed_cursor(prepare=True if len(digests) == 1 else None) as cursor:
            cursor.execute(sql, [session_id, *digests])
            rows = cursor.fetchall()
    except DatabaseError:
        if connection.in_atomic_block:
            raise  # (the transaction is broken: nothing more can be read in it)
        # The sources tables unreadable: counted alone, and the lookups find no upstream
        # tools (catalog.generation), as before the fold (docs/mcp.md, "What fails closed").
        logger.warning("repeat counts read without the upstream tools' generation", exc_info=True)
        return {(name, digest): n for name, digest, n in _REPEATS.tuples(session.pk, digests)}
    catalog.pin(rows[0][0])
    return {(name, digest): n for _, name, digest, n in rows if name is not None}


# The counts alone, when the sources tables cannot be read (floor.compiled).
_REPEATS = Compiled(
    lambda session_id, digests: (
        ToolCall.objects.filter(session_id=session_id, digest__in=digests)
        .order_by()
        .values_list("name", "digest")
        .annotate(n=Count("pk"))
    )
)


_SESSION_FIELD = ToolCall._meta.get_field("session").target_field


@functools.lru_cache(maxsize=64)
def _repeats_sql(vendor: str, count: int) -> str:
    """One row per (tool, digest) the session called before, each with the generation;
    one row of NULLs with it when there is none (a LEFT JOIN on one constant row). `vendor`
    keys the cache: the text is the same for every connection of a backend."""
    quote = connection.ops.quote_name
    table, name, digest, session = (
        quote(ToolCall._meta.db_table),
        quote(str(ToolCall._meta.get_field("name").column)),
        quote(str(ToolCall._meta.get_field("digest").column)),
        quote(str(ToolCall._meta.get_field("session").column)),
    )
    marks = ", ".join(["%s"] * count)
    generation = catalog.generation_sql(quote)
    # (the models' names only; every value is a parameter)
    return (
        f"SELECT {generation}, c.{name}, c.{digest}, c.n FROM (SELECT 1 AS one) AS o "  # noqa: S608
        f"LEFT JOIN (SELECT {name}, {digest}, COUNT(*) AS n FROM {table} "
        f"WHERE {session} = %s AND {digest} IN ({marks}) GROUP BY {name}, {digest}) AS c "
        "ON 1 = 1"
    )


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
        executor=_executor(item.name, session.client),
        edited_from_id=item.edited_from,
    )
    admission.calls.append(call)
    admission.events.append(
        EventSpec(
            kinds.CALL_RECEIVED,
            f"agent:{session.agent.name}",
            f"call:{call.pk}",
            {
                "call_id": str(call.pk),
                "tool_use_id": item.tool_use_id,
                "tool": item.name,
                "arguments": admission.masked_arguments.get(item.tool_use_id, item.raw_arguments),
                "digest": digest,
                "dialect": dialect,
                "batch_id": str(batch_id),
                "batch_index": index,
                "repeat_count": repeat_count,
                **({"edited_from": str(item.edited_from)} if item.edited_from else {}),
            },
            timezone.now(),
        )
    )
    return call


def _executor(name: str, client: str) -> str:
    tool = get_tool(name, client)
    return Executor.CLIENT if tool is not None and tool.client_executed else Executor.HARNESS


def call_context(
    call: ToolCall, session: AgentSession, mode: str, profile: Profile
) -> CallContext | None:
    tool = get_tool(call.name, session.client)
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
        agent_workspace=session.agent.workspace,
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
        tool = stages.resolve(call.name, session.client, session.agent.team_id)
        stages.validate(tool, call.arguments or {})
    except stages.Rejection as rejection:
        return _reject(call, rejection.message, rejection.stage)
    ctx = call_context(call, session, mode, profile)
    assert ctx is not None
    # The token it was sent with (the verified one read with the session): the worker runs
    # it only while that is still the agent's valid token (agents.token_refusal).
    call.provenance = {
        "mode": mode,
        "profile_version": profile.version,
        "token": session.agent.token_prefix,
    }
    # The OAuth sign-in it was sent under (agentauth.tokens: the access token's refresh-token
    # family, kept by a refresh): revoking that token ends its calls not yet run too.
    sign_in = getattr(session.agent, "sign_in", None)
    if sign_in is not None:
        call.provenance["sign_in"] = str(sign_in)
    if item.client_cwd:  # where the client runs it: policy reads it, the record keeps it
        ctx = replace(ctx, client_cwd=item.client_cwd)
        call.provenance["client_cwd"] = item.client_cwd
    if profile.layers:
        call.provenance["layers"] = layers.versions(profile)
    if admission.refused is not None:
        refused = admission.refused
        return _settle(call, Status.DENIED, refused.decision, kinds.CALL_DENIED, refused.message)
    # What it is decided under, and may only run under: the tool policy reads, not the one
    # resolved above (another thread's refresh of the catalog may come between the two).
    if ctx.tool.binding is not None:
        call.provenance["binding"] = dict(ctx.tool.binding)
    decision = stages.pre_execute(ctx)
    if decision.action == "deny":
        text = messages.policy_denied(decision.reason)
        return _settle(call, Status.DENIED, decision, kinds.CALL_DENIED, text)
    if decision.action == "cancel":
        text = messages.cancelled(decision.by, decision.reason)
        return _settle(call, Status.CANCELLED, decision, kinds.CALL_CANCELLED, text)
    denial = stages.guards(ctx)
    if denial:
        return _settle(call, Status.DENIED, denial.decision, kinds.CALL_DENIED, denial.message)
    if decision.action == "ask":
        if _over_ask_cap(session, admission):
            reason = limits.too_many_asks_message()
            capped = Decision("deny", "limit:pending_asks", reason)
            return _settle(call, Status.DENIED, capped, kinds.CALL_DENIED, reason)
        made = previews.preview_for(ctx)  # the command run over a copy-on-write workspace
        if made is not None:
            admission.previews.append((call, made))
            lifted = made.lifted(ctx, decision)  # an effect rule (dispatcher.policy.effect_rules)
            if lifted is not None:
                call.provenance = {**call.provenance, "effect_digest": made.digest}
                return _allow(call, lifted)
        return _ask(call, decision, ctx, admission, made)
    admission.allowed[call.pk] = ctx
    return _allow(call, decision)


def _over_ask_cap(session: AgentSession, admission: _Admission) -> bool:
    """Would one more ask pass the agent's HARNESS_MAX_PENDING_ASKS_PER_AGENT, counting its
    calls pending approval in every session and the asks of this message? Read once per
    message, and only when a call would ask: auto-allowed calls never pay for it. Two
    messages admitted at the same moment may each see the other's asks not yet committed,
    so the cap may be passed by the asks of messages admitted concurrently."""
    limit = settings.HARNESS_MAX_PENDING_ASKS_PER_AGENT
    if not admission.caps_asks or limit <= 0:
        return False
    if admission.pending_asks is None:
        admission.pending_asks = ToolCall.objects.filter(
            session__agent_id=session.agent_id, status=Status.PENDING_APPROVAL
        ).count()
    return admission.pending_asks + len(admission.asks) >= limit


def _ask(
    call: ToolCall,
    decision: Decision,
    ctx: CallContext,
    admission: _Admission,
    made: previews.Made | None = None,
) -> EventSpec:
    """The call waits for a reviewer, who will see `presentation` (also in the audit),
    with the previewed effect when there is one."""
    presentation = ctx.tool.present_call(call.arguments or {}, ctx.workspace)
    if made is not None:
        made.agree(presentation)  # (previewed where it is shown, or no preview)
        presentation = {**presentation, "preview": made.presentation()}
    admission.asks.append((call, presentation))
    return new_transition(
        call,
        Status.PENDING_APPROVAL,
        kind=kinds.CALL_APPROVAL_REQUESTED,
        actor=decision.by,
        payload={**call.provenance, **decision.as_provenance(), "presentation": presentation},
        **decision_fields(call, decision),
    )


def _allow(call: ToolCall, decision: Decision) -> EventSpec:
    """Queued for a worker, or released to the client that runs its own tools."""
    provenance = {**call.provenance, **decision.as_provenance()}
    if call.executor == Executor.CLIENT:
        return new_transition(
            call,
            Status.RELEASED,
            kind=kinds.CALL_ALLOWED,
            actor=decision.by,
            payload={**provenance, "executor": Executor.CLIENT},
            **release_fields(),
            **decision_fields(call, decision),
        )
    return new_transition(
        call,
        Status.QUEUED,
        kind=kinds.CALL_ALLOWED,
        actor=decision.by,
        payload=provenance,
        queued_at=timezone.now(),
        **decision_fields(call, decision),
    )


def _reject(call: ToolCall, reason: str, stage: str) -> EventSpec:
    decision = Decision("deny", f"stage:{stage}", reason)
    fields = decision_fields(call, decision, reason)
    fields["decision"] = "reject"
    return new_transition(
        call,
        Status.REJECTED,
        kind=kinds.CALL_REJECTED,
        actor="harness",
        payload={"stage": stage, "reason": reason},
        **fields,
    )


def _settle(call: ToolCall, to: Status, decision: Decision, kind: str, text: str) -> EventSpec:
    return new_transition(
        call,
        to,
        kind=kind,
        actor=decision.by,
        payload={**call.provenance, **decision.as_provenance()},
        **decision_fields(call, decision, text),
    )


def context_of(call: ToolCall) -> CallContext:
    """The call as policy sees it now, in its session (the owner's current profile).

    Raises ServiceError when that cannot be built: the tool is no longer registered or the
    arguments were never readable.
    """
    session = call.session
    ctx = call_context(call, session, *mode_and_profile(session))
    if ctx is None:
        raise ServiceError(f"'{call.name}' is not a registered tool with readable arguments.")
    return ctx
