"""The replay: a session's events, and the state of its calls after each one.

Computed here once, from the log alone, and rendered by the template (which escapes
everything an agent sent); static/audit.js only shows the step a reader is on. The page
reads the session as streams (`page_sections`: its steps in seq order, its events grouped
by call), so a session of any length is replayed in bounded memory (audit.streaming);
`build_replay` computes the same from events held in memory. An event
changes at most one call, so the state is kept as the versions of each call, each with
the steps it stands for (`first` to `last`), rather than a table per step: the page
grows with the session's length, not with its length times its calls.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.db.models import F, Min, Window
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import RowNumber

from . import kinds
from .models import AuditEvent
from .streaming import rendered

PENDING = "pending_approval"
# Events that note something about a call without changing it (a vote, an escalation, a
# report no released call took): shown as steps, never as the call's new state. Their
# payloads use the same words for other things ("to" is the team an ask is offered to,
# "content" what a client claims an unreleased call gave).
NOTE_KINDS = kinds.names_where("note")
# Events a read of the page takes at once.
STEPS_READ = 500


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


def idle_spans(pending: Iterable[tuple[int, int]], steps: int) -> list[Span]:
    """The spans of steps, of `steps`, at which no call waits for a reviewer, given the
    (first, last) steps of each pending state: the gaps between their union's runs."""
    spans: list[Span] = []
    start = 0  # the first step not yet known to have a call waiting
    for first, last in sorted(pending):
        if first > start:
            spans.append(Span(start, first - 1))
        start = max(start, last + 1)
    if start < steps:
        spans.append(Span(start, steps - 1))
    return spans


def call_states(grouped: Iterable[tuple[int, AuditEvent]], steps: int) -> Iterator[Shown]:
    """Each call's states with the steps they stand for, from `grouped`: the session's
    (step index, event) pairs, each call's events together and in order, the calls in the
    order they first appear (events naming no call may come anywhere). Holds one call's
    latest state only."""
    current: Shown | None = None
    for index, event in grouped:
        call_id = event.payload.get("call_id")
        if not call_id:
            continue
        if current is not None and current.call_id != str(call_id):
            yield current
            current = None
        new = CallState(tool=str(event.payload.get("tool") or ""))
        before = current.state if current is not None else new
        after = before if event.kind in NOTE_KINDS else _advance(before, event)
        if current is not None and after == before:
            continue
        if current is not None:
            yield replace(current, last=index - 1)
        current = Shown(str(call_id), after, index, steps - 1)
    if current is not None:
        yield current


def build_replay(events: Sequence[AuditEvent]) -> Replay:
    """Every step of the session, and each call's states with the steps they stand for,
    held in memory (the page streams the same from the database: `grouped_events`)."""
    first: dict[str, int] = {}
    for index, event in enumerate(events):
        if call_id := event.payload.get("call_id"):
            first.setdefault(str(call_id), index)
    order = sorted(
        (first[str(e.payload["call_id"])], index)
        for index, e in enumerate(events)
        if e.payload.get("call_id")
    )
    calls = list(call_states(((i, events[i]) for _, i in order), len(events)))
    steps = [_step(index, event) for index, event in enumerate(events)]
    pending = [shown for shown in calls if shown.state.pending]
    return Replay(
        steps, calls, pending, idle_spans(((s.first, s.last) for s in pending), len(events))
    )


# ---- The page, streamed from the database (audit.streaming) ---------------------------


def session_steps(chain: str, last: int) -> Iterator[Step]:
    """The chain's steps in order up to seq `last`, read STEPS_READ events at a time by
    (chain, seq)."""
    index, after = 0, 0
    while True:
        events = AuditEvent.objects.filter(chain=chain, seq__gt=after, seq__lte=last)
        page = list(events.order_by("seq")[:STEPS_READ])
        for event in page:
            yield _step(index, event)
            index += 1
        if len(page) < STEPS_READ:
            return
        after = page[-1].seq


def grouped_events(chain: str, last: int) -> Iterator[tuple[int, AuditEvent]]:
    """The chain's (step index, event) pairs up to seq `last`, as `call_states` takes
    them: ordered by the first seq of the event's call (payload call_id; events naming
    none form one group of their own), then by seq. One statement, read through a cursor
    STEPS_READ rows at a time (PostgreSQL: a server-side cursor), so nothing holds the
    session."""
    call = KeyTextTransform("call_id", "payload")
    events = (
        AuditEvent.objects.filter(chain=chain, seq__lte=last)
        .annotate(
            step=Window(RowNumber(), order_by=F("seq").asc()),
            call_first=Window(Min("seq"), partition_by=[call]),
        )
        .order_by("call_first", "seq")
    )
    for event in events.iterator(chunk_size=STEPS_READ):
        yield event.step - 1, event  # type: ignore[attr-defined]


PAGE = "audit/replay.html"


def page_sections(chain: str, steps: int, last: int) -> dict[str, Iterator[str]]:
    """The replay page's streamed sections (audit.streaming), each read from the database
    only when the response reaches it: the steps; the pending states, then the spans with
    none; every call's states. Each reads the chain up to seq `last`, the session as the
    page counted it (`steps` events): a section read while the session went on showed the
    events recorded meanwhile, past the page's count (steps and states the scrubber never
    reaches, the calls telling a later session than the steps did)."""

    def pending_then_idle() -> Iterator[str]:
        spans: list[tuple[int, int]] = []

        def pending() -> Iterator[Shown]:
            for shown in call_states(grouped_events(chain, last), steps):
                if shown.state.pending:
                    spans.append((shown.first, shown.last))
                    yield shown

        yield from rendered(PAGE, "pending", pending())
        yield from rendered(PAGE, "idle", iter(idle_spans(spans, steps)))

    return {
        "steps": rendered(PAGE, "steps", session_steps(chain, last)),
        "pending": pending_then_idle(),
        "calls": rendered(PAGE, "calls", call_states(grouped_events(chain, last), steps)),
    }
