"""Stages 6 to 10 in the worker: re-check, claim, execute, project, post-execute, finalize,
result; and the reconciler that ends lost leases as outcome_unknown and re-sends lost
messages. The state changes themselves are in dispatcher.transitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from dispatcher import admission, batches, pipeline, previews, transitions
from dispatcher.admission import call_context
from dispatcher.agents import credential_refusal, mode_and_profile, token_refusal
from dispatcher.models import Preview, Status, ToolCall
from dispatcher.policy import git_reading, layers, stages
from dispatcher.policy.context import CallContext
from dispatcher.tools import messages, sandbox_git
from dispatcher.tools.base import ExecutionContext, Tool
from floor.compiled import Compiled
from floor.redis_clients import one_round_trip

logger = logging.getLogger(__name__)


# --- Stage 6 to 10 -----------------------------------------------------------------------


# The worker's first read of every call, compiled once (floor.compiled).
_CALL_WITH_SESSION = Compiled(
    lambda pk: (
        ToolCall.objects.select_related("session__agent__owner__permission_profile")
        .annotate(**layers.session_revisions("session__agent__team_id"))
        .filter(pk=pk)
        .order_by()[:1]
    )
)


def execute_turn(message_call_id: str) -> None:
    """A worker's message: the call of its turn (batches.take_turn) run, and the place its
    owner holds among running calls given back however the call ends, in one round trip
    to Redis with the result's wake-up (redis_clients.one_round_trip). No call: the turn
    is owed (every owner with calls waiting runs as many as its cap allows)."""
    turn = batches.take_turn(message_call_id)
    if not turn.slot:
        if turn.call_id:
            execute_call(turn.call_id)
        return
    with one_round_trip(turn.url):
        try:
            execute_call(turn.call_id, turn=turn)
        finally:
            batches.end_turn(turn)


def execute_call(call_id: str, *, turn: batches.Turn | None = None) -> None:
    """Stages 6 to 10 for one queued call. Idempotent: a second delivery does nothing.
    `turn`: the worker's (execute_turn), whose place lapses with the call's lease once
    the call is claimed."""
    try:
        call = _CALL_WITH_SESSION.first(uuid.UUID(call_id))
    except ValueError:  # not a call id: nothing to run
        return
    if call is None or call.status != Status.QUEUED:
        return
    session = call.session
    refused = token_refusal(call, session.agent)  # voided or rotated while it was queued
    if refused is not None:
        return transitions.deny_before_run(call, refused)
    revisions = layers.revisions_of(call)
    ctx = call_context(
        call, session, *mode_and_profile(session, preloaded=True, revisions=revisions)
    )
    if ctx is None:
        gone = stages.GuardDenial((("registry", "The tool is no longer registered."),))
        return transitions.deny_before_run(call, gone)
    denial = stages.guards(ctx)  # re-run: time has passed since admission
    if denial:
        return transitions.deny_before_run(call, denial)
    _claim_and_run(call, ctx, turn)


def run_inline(
    call: ToolCall, ctx: CallContext, loop: asyncio.AbstractEventLoop | None = None
) -> None:
    """Stages 6 to 10 in the request that admitted `call` a moment ago, claimed
    (admission.admit_message's `inline`), as the worker would run it, without the queue:
    the same host-only timeout, the same result and its event. `ctx` is what policy saw
    at admission, in this process, an instant ago (the worker re-runs the guards because
    time has passed since). When the result cannot be written, the call stays running
    and its lease ends it as outcome_unknown, as for a worker that died running it:
    this raises then. `loop`: the request's event loop, which awaits this (the body
    may make its request there: ExecutionContext.loop)."""
    _run_claimed(call, ctx, before_body=_give_back_connection, admitted=True, loop=loop)


def _claim_and_run(call: ToolCall, ctx: CallContext, turn: batches.Turn | None = None) -> None:
    """A queued call in the worker: its approved preview's effect applied when the
    workspace is as previewed, else claimed and run; under the workspace's lock
    (dispatcher.previews) so no other call of the session runs in between. `turn`'s
    place is held for the call's lease before the claim (a worker killed after it leaves
    a place that lapses when the reconciler ends the call)."""
    session = call.session
    tool = ctx.tool
    workspace = Path(session.workspace)
    row = previews.kept_preview(call) if tool.previewable else None
    reason = ""
    lock = _workspace_lock(tool, workspace)
    if lock is None:
        # Another call of the session holds the workspace: this call goes back to the end
        # of its agent's turn rather than hold the worker (one agent's few slow commands
        # in one session held every worker, and every other agent's call waited for all
        # of them, whatever its turn: batches). Its message is sent now, so said: by the
        # admission's time the reconciler took it for lost every HARNESS_REQUEUE_AFTER and
        # sent another, each of which found the lock held and sent itself again (behind
        # one long command, a waiting call gathered a message every 30 s). A call no
        # longer queued (cancelled, taken by another message) needs none.
        _send_again(call)
        return None
    with lock:
        if row is not None:
            outcome, reason = previews.settle(call, tool, row, workspace)
            if outcome == "gone":  # its claim wrote nothing (another worker, a dead credential)
                refuse_dead_credential(call)
            if outcome in ("applied", "gone"):
                return None
            if outcome == "run":  # for real, not the previewed effect: as it was shown
                changed = previews.changed_since_ask(call, tool, workspace)
                outcome, reason = ("repreview", changed) if changed else (outcome, reason)
        else:  # (a file tool's approved diff binds as a previewed effect does)
            reason = previews.changed_since_ask(call, tool, workspace) or ""
            outcome = "repreview" if reason else "run"
        # (after the ask's check: an approved call is shown again, under the tool as it is)
        changed = _changed_since_admission(call, tool) if outcome == "run" else None
        if outcome == "run" and changed is None:
            leased_from = timezone.now()  # before the place's lapse: it never ends first
            if turn is not None:
                seconds = tool.timeout + settings.HARNESS_LEASE_GRACE
                held = batches.hold(turn, seconds, batches.agent_of(call))
                if not held:  # its owner's place not held: left queued (fail closed) ...
                    if held is batches.Hold.AT_CAP:
                        # ... and sent again now, to wait for its owner's next place (left
                        # to the reconciler, it waited HARNESS_REQUEUE_AFTER: a take's place
                        # that lapsed under load before its hold left a batch's call queued)
                        _send_again(call)
                    return None
            confirm = None if turn is None else functools.partial(batches.kept_since_hold, turn)
            claimed = transitions.claim(call, tool, leased_from=leased_from, confirm=confirm)
            if not claimed and _sign_in_renewed(call, turn):
                claimed = transitions.claim(call, tool, leased_from=leased_from, confirm=confirm)
            if claimed:
                if turn is not None:
                    turn.claimed = True  # (its place given back: batches.count_running's too)
                _run_claimed(call, ctx, row=row)
            elif refuse_dead_credential(call):
                pass
            elif turn is not None and turn.lost:
                # Redis lost its data since the hold: the place may not be counted (left
                # queued), and the call's listing is gone with it (sent again now).
                _send_again(call)
            return None
    if changed is not None:
        transitions.deny_before_run(call, stages.GuardDenial((("definition", changed),)))
        return None
    # The workspace changed since the approved preview or diff: presented again, asking
    # again (outside the lock, which a new preview takes).
    proposed = previews.repreview(call, row, reason)
    if proposed is not None:
        admission.submit_calls(
            session=session,
            dialect=call.dialect,
            proposed=[proposed],
            place=(call.batch_id, call.batch_index),
        )
    return None


def _sign_in_renewed(call: ToolCall, turn: batches.Turn | None) -> bool:
    """After a claim of `call` that wrote nothing: whether it may be tried once more, its
    OAuth sign-in refreshed while the claim waited (the refresh revoked the refresh token
    the claim held, and wrote its successor after the claim's snapshot:
    transitions.live_credential_sql). Only for a call sent under a sign-in, still queued,
    whose credential a fresh read finds live (`credential_refusal`), and whose place was
    not lost (`turn.lost`: sent again instead)."""
    if not (call.provenance or {}).get("sign_in") or (turn is not None and turn.lost):
        return False
    fresh = _CALL_WITH_SESSION.first(call.pk)
    if fresh is None or fresh.status != Status.QUEUED:
        return False
    return credential_refusal(fresh, fresh.session.agent) is None


def refuse_dead_credential(call: ToolCall) -> bool:
    """After a claim of `call` that wrote nothing: when the call is still queued and the
    credential that sent it died (a sign-out, a revocation, a void, a rotation or a move
    committed after the worker's read and before its claim's statement:
    transitions.claim's condition), it ends denied, unrun, with its event
    (`deny_before_run`, guard `token` or `team`), never left queued. True then. Otherwise
    (another worker claimed it, a decision ended it, the claim was not confirmed) it is
    left as it is. One read more, on a claim that failed only."""
    fresh = _CALL_WITH_SESSION.first(call.pk)
    if fresh is None or fresh.status != Status.QUEUED:
        return False
    refused = credential_refusal(fresh, fresh.session.agent)
    if refused is None:
        return False
    transitions.deny_before_run(fresh, refused)
    return True


def _send_again(call: ToolCall) -> None:
    """`call`, taken from its turn but not run, back at the end of its agent's turn with a
    message sent now, so said (`enqueued_at`: the reconciler sends none while it is fresh);
    a call no longer queued (cancelled, taken by another message) needs none. Never raises:
    a message Redis cannot take is left to the reconciler, as a place that cannot be held
    is (the worker's task failed with Redis's error, a traceback at ERROR)."""
    if ToolCall.objects.filter(pk=call.pk, status=Status.QUEUED).update(enqueued_at=timezone.now()):
        try:
            batches.enqueue(str(call.pk), batches.agent_of(call), resend=True)
        except redis.RedisError:
            logger.warning(
                "could not send call %s again; the reconciler sends it", call.pk, exc_info=True
            )


# How long a worker waits for a workspace another call holds before giving its call back
# to the queue: a command's lock is usually a moment (a write), or as long as the command.
_LOCK_PATIENCE = 1.0


def _workspace_lock(tool: Tool, workspace: Path) -> contextlib.ExitStack | None:
    """The workspace's lock for `tool`, held (leave the returned stack to release it), or
    None when another call held it for all of `_LOCK_PATIENCE`."""
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(
            previews.lock_within(
                lambda: previews.lock_for(tool, workspace, wait=False), _LOCK_PATIENCE
            )
        )
    except TimeoutError:
        return None
    return stack


def _changed_since_admission(call: ToolCall, tool: Tool) -> str | None:
    """Why `call` must not run under `tool` as the worker resolved it now, or None: the
    tool binds its calls (`Tool.binding`: an upstream tool's server registration and
    accepted definition) and its binding differs from the one the call was admitted
    under, which policy decided it by (an admin accepted another definition of the tool,
    or registered its server again, while the call was queued). A call admitted without
    the record (before Harness kept it) cannot show its binding: refused too. The inline
    lane needs no check: it runs the tool its admission resolved (`one_generation`)."""
    if tool.binding is None:
        return None
    admitted = (call.provenance or {}).get("binding")
    if admitted == dict(tool.binding):
        return None
    return messages.definition_changed_since_admission(call.name)


def _give_back_connection() -> None:
    """A pooled database connection goes back to the pool while an inline call's body
    runs (an upstream call may take its whole timeout: a web process's requests must not
    run out of connections meanwhile). The worker keeps its own."""
    connection = connections[DEFAULT_DB_ALIAS]
    if getattr(connection, "pool", None) is not None and not connection.in_atomic_block:
        connection.close()


def _run_claimed(
    call: ToolCall,
    ctx: CallContext,
    *,
    row: Preview | None = None,
    before_body: Callable[[], None] | None = None,
    admitted: bool = False,
    loop: asyncio.AbstractEventLoop | None = None,
) -> None:
    """Stages 6 to 10 of a call this process claimed (`row`: its approved preview, which
    could not be applied: the audit and the model's result say the command ran).
    `admitted`: claimed by its admission a moment ago (the inline lane), which woke
    nobody: its running notice is its first."""
    if before_body is not None:
        before_body()
    started = time.monotonic()
    outcome = pipeline.execute(
        ctx.tool,
        _execution_context(call, ctx, loop),
        call.arguments or {},
        while_running=_running_notice(call, admitted),
    )
    record_result(call, ctx, outcome, started=started, row=row)


async def run_body_async(call: ToolCall, ctx: CallContext) -> tuple[pipeline.Outcome, float]:
    """Stage 6 of a call its admission claimed a moment ago (the inline lane) whose tool
    runs on the loop (pipeline.runs_on_loop), awaited on the request's own loop, holding
    no thread meanwhile: its outcome and how long it ran (seconds), for `record_result`
    (on a thread: it writes). A failure of its own is the outcome's error; it raises only
    when cancelled (its loop shutting down)."""
    started = time.monotonic()
    try:
        outcome = await pipeline.execute_async(
            ctx.tool,
            _execution_context(call, ctx, asyncio.get_running_loop()),
            call.arguments or {},
            while_running=_running_notice(call, admitted=True),
        )
    except Exception as exc:  # noqa: BLE001 - every failure becomes an answer
        outcome = pipeline.Outcome(error=exc)
    return outcome, time.monotonic() - started


def _execution_context(
    call: ToolCall, ctx: CallContext, loop: asyncio.AbstractEventLoop | None
) -> ExecutionContext:
    return ExecutionContext(
        workspace=Path(call.session.workspace),
        call_id=str(call.pk),
        timeout=ctx.tool.timeout,
        output_limit=settings.HARNESS_OUTPUT_LIMIT,
        raw_arguments=call.raw_arguments,
        loop=loop,
        git_guard=git_guard(call),
    )


def git_guard(call: ToolCall) -> str:
    """What of the workspace's git metadata that makes git run programs the call's
    programs may not write (dispatcher.tools.sandbox_git). A command a reviewer approved
    runs as they saw it; any other (allowed by a rule, a session grant, a mode, an effect
    rule) finds it read-only, whatever links it or an earlier call of its message made,
    except `.git/config` for a git command that changes only its configuration by design
    (git_reading.changes_only_config)."""
    if call.decision == "allow" and call.decided_by.startswith("user:"):
        return sandbox_git.NONE
    argv = (call.arguments or {}).get("argv")
    words = [str(word) for word in argv] if isinstance(argv, list) else []
    return sandbox_git.ALL_BUT_CONFIG if git_reading.changes_only_config(words) else sandbox_git.ALL


def _running_notice(call: ToolCall, admitted: bool) -> Callable[[], None]:
    previous = Status.RECEIVED if admitted else Status.QUEUED
    return lambda: transitions.announce_running(call, previous)


def record_result(
    call: ToolCall,
    ctx: CallContext,
    outcome: pipeline.Outcome,
    *,
    started: float | None = None,
    seconds: float | None = None,
    row: Preview | None = None,
) -> None:
    """Stages 7 to 10 of a claimed call whose body ran (`outcome`), since `started`
    (time.monotonic()) or for `seconds`: its content projected, post-executed and
    finalized, and its result written with its event (transitions.finish). Raises when
    the result cannot be written: the call stays running, and its lease ends it as
    outcome_unknown."""
    tool = ctx.tool
    if outcome.timed_out:
        status, content, is_error = (
            Status.TIMED_OUT,
            messages.timed_out(tool.name, tool.timeout),
            True,
        )
    else:
        content, is_error = pipeline.project_content(tool, outcome)
        if not is_error:
            content = pipeline.post_execute(ctx, content)
        status = Status.COMPLETED
    content = pipeline.finalize_content(
        tool, content, repeat_count=call.repeat_count, raw_arguments=call.raw_arguments
    )
    # An approved preview that could not be applied: the command ran for real, so said to
    # the model (after the result, as the repeat reminder is) and in the audit
    ran_instead = previews.ran_instead(row, tool.name)
    audit = None
    if ran_instead is not None:
        audit, note = ran_instead
        content += note
    if seconds is None:
        assert started is not None
        seconds = time.monotonic() - started
    transitions.finish(call, status, content, is_error, seconds, audit=audit)


# --- Reconciler --------------------------------------------------------------------------


def reconcile() -> dict[str, int]:
    """End expired leases as outcome_unknown; re-send messages for queued calls that were lost.

    Safe to run anywhere at any time: every change is a conditional update.
    """
    now = timezone.now()
    unknown = 0
    for call in ToolCall.objects.lease_expired(now):
        unknown += transitions.mark_outcome_unknown(call)
    unreported = sum(transitions.mark_unreported(c) for c in ToolCall.objects.report_overdue(now))
    stale = now - timedelta(seconds=settings.HARNESS_REQUEUE_AFTER)
    resent = 0
    # Oldest first (each batch once): an agent's calls lost with the broker's messages are
    # sent again in the order they were queued, as they were sent the first time
    stale_batches = dict.fromkeys(
        ToolCall.objects.filter(status=Status.QUEUED, queued_at__lt=stale)
        .exclude(enqueued_at__gt=stale)
        .order_by("queued_at", "pk")
        .values_list("batch_id", flat=True)
    )
    for batch_id in stale_batches:
        resent += ToolCall.objects.filter(
            batch_id=batch_id, status=Status.QUEUED, enqueued_at__lt=stale
        ).update(enqueued_at=None)
        batches.dispatch_ready(batch_id)
    swept = previews.sweep()
    return {
        "outcome_unknown": unknown,
        "unreported": unreported,
        "resent": resent,
        "previews_removed": swept,
    }
