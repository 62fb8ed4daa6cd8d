"""One decide-only call from a client that runs its tools itself: admit it, hold it while a
reviewer decides, answer allow or deny. Shared by the gateways of such clients (Claude
Code's hooks; an MCP permission-prompt tool), so they decide exactly alike.

The call passes the whole pipeline like any other (dispatcher.admission.submit_calls):
stored with its exact input and digest before any decision, validated, rules, mode,
guards. An allow applies to exactly the input it logged: the caller must run that input,
never another (Harness never answers with changed input).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Literal

from asgiref.sync import sync_to_async

from dispatcher import admission, limits, transitions
from dispatcher.models import AgentSession, Dialect, Status, ToolCall
from dispatcher.proposals import ProposedCall, canonical_json, digest_of

from .api import reloader, slot_taken, wait_until_terminal


@dataclass(frozen=True)
class Verdict:
    """What the client must do with one tool call.

    `reason` is for the model and the user: on allow, who decided and why (the mode, the
    rule, the grant or the person); on deny, what the model should read (a reviewer's
    feedback verbatim, a guard's reason, an expiry).
    """

    action: Literal["allow", "deny"]
    reason: str
    call_id: str = ""
    status: str = ""
    decided_by: str = ""

    @property
    def allowed(self) -> bool:
        return self.action == "allow"


def _pending(call: ToolCall) -> bool:
    return call.status == Status.PENDING_APPROVAL


def _decided(call: ToolCall) -> bool:
    return not _pending(call)


async def decide_client_call(
    *,
    session: AgentSession,
    tool_name: str,
    tool_input: dict[str, Any],
    tool_use_id: str,
    wait_seconds: float,
    dialect: str = Dialect.ANTHROPIC,
) -> Verdict:
    """Admit the client's tool call in `session` and wait (up to `wait_seconds`, without
    polling) while it asks a reviewer; then the verdict.

    A call still pending at the deadline is cancelled (the client stopped waiting), and so
    is one whose request is abandoned (the task is cancelled): it never stays approvable
    after the client gave up. Idempotent by `tool_use_id`: the same id with the same input
    is the same call (answered by its state now); with other input it is denied.
    Raises what admission raises (DatabaseError: the caller answers "unavailable").
    """
    admitted = await sync_to_async(admit_client_call)(
        session=session,
        tool_name=tool_name,
        tool_input=tool_input,
        tool_use_id=tool_use_id,
        dialect=dialect,
    )
    return await verdict_after(admitted, session, wait_seconds)


def admit_client_call(
    *,
    session: AgentSession,
    tool_name: str,
    tool_input: dict[str, Any],
    tool_use_id: str,
    dialect: str = Dialect.ANTHROPIC,
    profile_preloaded: bool = False,
    client_cwd: str = "",
) -> ToolCall | Verdict:
    """The admitted call, or the denial of an id already used for another call (the
    synchronous half of decide_client_call, for a caller already on the ORM's thread).
    `client_cwd`: the directory the client runs it in, as its hook reported it."""
    arguments = dict(tool_input)
    proposed = ProposedCall(
        tool_use_id, tool_name, canonical_json(arguments), arguments, client_cwd=client_cwd
    )
    [call] = admission.submit_calls(
        session=session, dialect=dialect, proposed=[proposed], profile_preloaded=profile_preloaded
    )
    if call.name != tool_name or call.digest != digest_of(proposed):
        return Verdict(
            "deny",
            f"The tool use id '{tool_use_id}' was already used in this session for another "
            "call; Harness decides each input once. Propose the call again.",
            str(call.pk),
            call.status,
        )
    return call


async def verdict_after(
    admitted: ToolCall | Verdict, session: AgentSession, wait_seconds: float
) -> Verdict:
    """The verdict on an admitted call, waiting while it asks a reviewer (the asynchronous
    half of decide_client_call)."""
    if isinstance(admitted, Verdict):
        return admitted
    call = admitted
    if _pending(call):
        call = await _wait_for_decision(call, session, wait_seconds)
    return verdict_of(call)


async def _wait_for_decision(call: ToolCall, session: AgentSession, seconds: float) -> ToolCall:
    try:
        return await _wait_with_slot(call, session, seconds)
    except asyncio.CancelledError:
        # The client went away (Claude Code killed its hook, the user interrupted): the
        # call must not stay approvable. Shielded, so the cancellation runs to the end.
        reason = "The client stopped waiting for the decision (its hook was interrupted)."
        await asyncio.shield(sync_to_async(_give_up)(call, session, reason))
        raise


async def _wait_with_slot(call: ToolCall, session: AgentSession, seconds: float) -> ToolCall:
    """Hold one of the agent's wait slots (dispatcher.limits) while waiting; with none free,
    the call is cancelled at once (recorded, with why) and the client told so."""
    if seconds <= 0:  # nothing is held: the call is given up at once
        return await _wait_holding_slot(call, session, seconds)
    try:
        slot = await slot_taken(  # (a client gone meanwhile: given back when it is taken)
            sync_to_async(limits.reserve_wait, thread_sensitive=False)(session.agent, seconds),
            lambda slot: slot,
        )
    except limits.TooManyWaits as full:
        reason = full.message(
            "So this call was not held for a reviewer and did not run. Wait until one of "
            "the agent's waiting calls is decided, then propose this call again."
        )
        return await sync_to_async(_give_up)(call, session, reason)
    try:
        return await _wait_holding_slot(call, session, seconds)
    finally:
        await asyncio.shield(sync_to_async(limits.release_wait, thread_sensitive=False)(slot))


async def _wait_holding_slot(call: ToolCall, session: AgentSession, seconds: float) -> ToolCall:
    ids = [str(call.pk)]
    started = time.monotonic()
    [call] = await wait_until_terminal(ids, seconds, reloader(ids), [call], settled=_decided)
    if not _pending(call):
        return call
    waited = time.monotonic() - started
    if waited + 0.5 < seconds:
        reason = (
            "Harness could not wait for a reviewer's decision (its wake-up channel is "
            "unavailable), so the call was not run. Try again shortly."
        )
    else:
        reason = (
            f"No reviewer decided within {seconds:g} seconds (the hook's deadline), so the "
            "call was not run. Ask the user to approve it in Harness's approvals queue "
            "while the call waits, then try again."
        )
    return await sync_to_async(_give_up)(call, session, reason)


def _give_up(call: ToolCall, session: AgentSession, reason: str) -> ToolCall:
    """Cancel the pending call for the client; if a decision won the race, that stands."""
    transitions.cancel_call(call_id=call.pk, actor=f"agent:{session.agent.name}", reason=reason)
    call.refresh_from_db()
    return call


def verdict_of(call: ToolCall) -> Verdict:
    """Only a released call is allowed: decided for the client and not yet reported."""
    ids = {"call_id": str(call.pk), "status": call.status, "decided_by": call.decided_by}
    if call.status == Status.RELEASED:
        return Verdict("allow", allow_reason(call), **ids)
    if call.status in (Status.REPORTED, Status.UNREPORTED):
        reason = (
            "This tool use was already allowed once and its result recorded; an allow is "
            "used once. Propose the call again."
        )
        return Verdict("deny", reason, **ids)
    if call.status in (Status.PENDING_APPROVAL, Status.QUEUED, Status.RUNNING):
        reason = f"The call is {call.status.replace('_', ' ')} in Harness, so it may not run here."
        return Verdict("deny", reason, **ids)
    reason = call.content or f"The call was {call.status} by Harness and must not run."
    return Verdict("deny", reason, **ids)


def allow_reason(call: ToolCall) -> str:
    """Who allowed it and why: "Approved by alice in Harness." or the mode, rule or grant."""
    by, reason = call.decided_by, call.reason
    if by.startswith("user:"):
        text = f"Approved by {by.removeprefix('user:')} in Harness."
        return text if reason in ("", "Approved by a reviewer.") else f"{text} Note: {reason}"
    return f"Allowed by Harness ({by}): {reason}"
