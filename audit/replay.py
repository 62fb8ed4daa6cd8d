"""The replay: a session's events, and the state of its calls after each one.

Computed here once, from the log alone, and rendered by the template (which escapes
everything an agent sent); static/audit.js only shows the step a reader is on. An event
changes at most one call, so the state is kept as the versions of each call, each with
the steps it stands for (`first` to `last`), rather than a table per step: the page
grows with the session's length, not with its length times its calls.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from . import kinds
from .models import AuditEvent

PENDING = "pending_approval"
# Events that note something about a call without changing it (a vote, an escalation, a
# report no released call took): shown as steps, never as the call's new state. Their
# payloads use the same words for other things ("to" is the team an ask is offered to,
# "content" what a client claims an unreleased call gave).
NOTE_KINDS = kinds.names_where("note")


@dataclass(frozen=True)
class Step:
    """One event as the replay shows it: its line (seq, kind, actor, time), and its
    payload as indented JSON."""

    index: int
    kind: str
    line: str
    payload: str


@dataclass(frozen=True)
class CallState:
    """A call as it stood after a step: its latest status, who decided and why, what
    the reviewer was shown (indented JSON) and what the model got back."""

    tool: str
    status: str = "received"
    by: str = ""
    content: str | None = None
    presentation: str = "null"
    # A client's report of other input than the call was allowed: marked, never blended in.
    mismatch: bool = False

    @property
    def pending(self) -> bool:
        return self.status == PENDING


@dataclass(frozen=True)
class Shown:
    """A call's state, shown from step `first` to step `last` (both included)."""

    call_id: str
    state: CallState
    first: int
    last: int


@dataclass(frozen=True)
class Span:
    """Steps `first` to `last` (both included): the steps with no call pending."""

    first: int
    last: int


@dataclass(frozen=True)
class Replay:
    steps: list[Step]
    # Grouped by call, in the order the calls first appear, each call's states in order:
    # at any step, the states shown are one per call seen so far, in that order.
    calls: list[Shown]
    # The states that wait for a reviewer (the pending list), and the steps where none do.
    pending: list[Shown]
    idle: list[Span]


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def _step(index: int, event: AuditEvent) -> Step:
    line = f"#{event.seq} {event.kind} by {event.actor} at {event.created_at.isoformat()}"
    return Step(index, event.kind, line, _pretty(event.payload))


def _advance(state: CallState, event: AuditEvent) -> CallState:
    """The call's state after one of its events."""
    p = event.payload
    changes: dict[str, Any] = {}
    if p.get("to"):
        changes["status"] = str(p["to"])
    if p.get("by"):
        changes["by"] = str(p["by"]) + (f": {p['reason']}" if p.get("reason") else "")
    if event.kind == kinds.CALL_APPROVAL_REQUESTED:
        changes["presentation"] = _pretty(p.get("presentation"))
    if p.get("content") is not None:
        changes["content"] = str(p["content"])
    if event.kind == kinds.CALL_REPORTED and p.get("input_matches") is False:
        changes["mismatch"] = True
    return replace(state, **changes)


def _idle(pending: list[Shown], steps: int) -> list[Span]:
    """The spans of steps at which no call waits for a reviewer."""
    change = [0] * (steps + 1)
    for shown in pending:
        change[shown.first] += 1
        change[shown.last + 1] -= 1
    spans: list[Span] = []
    waiting = 0
    for index in range(steps):
        waiting += change[index]
        if waiting:
            continue
        if spans and spans[-1].last == index - 1:
            spans[-1] = Span(spans[-1].first, index)
        else:
            spans.append(Span(index, index))
    return spans


def build_replay(events: Sequence[AuditEvent]) -> Replay:
    """Every step of the session, and each call's states with the steps they stand for."""
    history: dict[str, list[Shown]] = {}
    for index, event in enumerate(events):
        call_id = event.payload.get("call_id")
        if not call_id:
            continue
        states = history.setdefault(str(call_id), [])
        new = CallState(tool=str(event.payload.get("tool") or ""))
        before = states[-1].state if states else new
        after = before if event.kind in NOTE_KINDS else _advance(before, event)
        if states and after == before:
            continue
        if states:
            states[-1] = replace(states[-1], last=index - 1)
        states.append(Shown(str(call_id), after, index, len(events) - 1))
    calls = [shown for states in history.values() for shown in states]
    steps = [_step(index, event) for index, event in enumerate(events)]
    pending = [shown for shown in calls if shown.state.pending]
    return Replay(steps, calls, pending, _idle(pending, len(events)))
