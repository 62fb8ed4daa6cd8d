"""A session as the log tells it: its calls, decisions, stage times and results.

Built from AuditEvent rows alone (never from the dispatcher's tables), so what the
timeline, the replay and the transcript show is exactly what the log can prove. The
timeline page reads one page of calls at a time (`call_page`); the transcript a few
hundred calls at a time (`transcript_batches`), and the replay its steps and states as
streams (audit.replay); `build_timeline` reads the whole session at once.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from typing import Any, cast

from django.db.models import BigIntegerField, F, Min, Q, QuerySet, Value, Window
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce, NullIf, RowNumber

from . import kinds
from .models import AuditEvent

# Calls per timeline page. Each call is a card of a screen or so (arguments, decision,
# result); 25 is a few minutes of reading, and keeps a page as cheap to build as a
# 100-event session's whole timeline (which is about 25 calls of four events).
PAGE_CALLS = 25
# The compact timeline's one-line arguments.
SHORT_ARGUMENTS = 90

DECISION_KINDS = kinds.names_where("decision")
REVIEW_KINDS = kinds.names_where("review")
RESULT_KINDS = kinds.names_where("result")
NOTE_KINDS = kinds.names_where("note")
# The calls' terminal statuses, as their result events name them (audit imports nothing
# from the lifecycle: these are the status strings of dispatcher.models.TERMINAL_STATUSES,
# which tests/audit keep equal).
TERMINAL = {
    "completed",
    "timed_out",
    "outcome_unknown",
    "denied",
    "rejected",
    "cancelled",
    "expired",
    "reported",
    "unreported",
    "edited",
}


@dataclass(frozen=True)
class Note:
    """A line on the call's card: a vote, a discarded vote, a refused decision, a report
    that does not match; `reads` is the kind's registered reading."""

    kind: str
    reads: str
    actor: str
    at: datetime
    detail: str


def _note(event: AuditEvent) -> Note:
    p = event.payload
    parts = [str(p[key]) for key in ("reviewer", "reason", "summary") if p.get(key)]
    return Note(
        event.kind, kinds.get(event.kind).reads, event.actor, event.created_at, ": ".join(parts)
    )


@dataclass
class Call:
    call_id: str
    tool: str = ""
    tool_use_id: str = ""
    arguments: str = ""
    digest: str = ""
    dialect: str = ""
    batch_id: str = ""
    batch_index: int = 0
    status: str = "received"
    decision: dict[str, Any] = field(default_factory=dict)
    review: dict[str, Any] = field(default_factory=dict)
    presentation: Any = None
    content: str | None = None
    is_error: bool = False
    times: dict[str, datetime] = field(default_factory=dict)
    seconds: float | None = None
    events: list[AuditEvent] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    # The client's report names other input than the call was allowed: {"tool", "input"}.
    report_mismatch: dict[str, str] | None = None

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def stages(self) -> list[tuple[str, float]]:
        """(stage, seconds) for each stage the call went through."""
        t = self.times
        spans = [
            ("admission", "received", "decided"),
            ("waiting for a reviewer", "asked", "reviewed"),
            ("queued", "queued", "started"),
            ("execution", "started", "finished"),
        ]
        return [(name, (t[b] - t[a]).total_seconds()) for name, a, b in spans if a in t and b in t]

    @property
    def outcome(self) -> str:
        """The call's outcome in one word, for the compact timeline's chip: its status, or
        "error" for a completed call whose tool reported an error."""
        if self.status in ("completed", "reported") and self.is_error:
            return "error"
        return self.status

    @property
    def decided_by(self) -> str:
        """Who decided: the reviewer (or expiry, or the agent) for an ask, else the
        mode, rule, grant or guard that decided at admission."""
        return str((self.review or self.decision).get("by", ""))

    @property
    def short_arguments(self) -> str:
        """The arguments on one line, at most SHORT_ARGUMENTS characters: the values of
        an object's keys (`path=a.txt command=npm test`), or the text itself."""
        parsed = self.parsed_arguments
        if isinstance(parsed, dict) and "_unparsed_arguments" not in parsed:
            parts = [f"{k}={_one_line(v)}" for k, v in parsed.items()]
            text = " ".join(parts)
        else:
            text = " ".join(self.arguments.split())
        return text if len(text) <= SHORT_ARGUMENTS else text[: SHORT_ARGUMENTS - 1] + "…"

    @property
    def parsed_arguments(self) -> Any:
        try:
            return json.loads(self.arguments)
        except ValueError:
            return {"_unparsed_arguments": self.arguments}


def _one_line(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return " ".join(text.split())


def _apply(call: Call, event: AuditEvent) -> None:
    p, kind, at = event.payload, event.kind, event.created_at
    call.events.append(event)
    if kind == kinds.CALL_RECEIVED:
        call.tool = p.get("tool", "")
        call.tool_use_id = p.get("tool_use_id", "")
        call.arguments = p.get("arguments", "")
        call.digest = p.get("digest", "")
        call.dialect = p.get("dialect", "")
        call.batch_id = p.get("batch_id", "")
        call.batch_index = p.get("batch_index", 0)
        call.times["received"] = at
        return
    if kind in NOTE_KINDS:
        call.notes.append(_note(event))
        return
    call.status = p.get("to", call.status)
    provenance = {k: p.get(k, "") for k in ("action", "by", "reason", "rule", "stage")}
    if kind in REVIEW_KINDS and "asked" in call.times:
        call.review = {**provenance, "actor": event.actor, **_extra(p)}
        call.times["reviewed"] = at
    elif kind in DECISION_KINDS:
        call.decision = {**provenance, "actor": event.actor, **_layering(p)}
        call.times["decided"] = at
    if kind == kinds.CALL_APPROVAL_REQUESTED:
        call.presentation = p.get("presentation")
        call.times["asked"] = at
    if p.get("to") == "queued":
        call.times["queued"] = at
    if kind == kinds.CALL_STARTED:
        call.times["started"] = at
    if kind == kinds.CALL_REPORTED and p.get("input_matches") is False:
        call.report_mismatch = {
            "tool": str(p.get("reported_tool", "")),
            "input": str(p.get("reported_input", "")),
        }
    if kind in RESULT_KINDS:
        call.times["finished"] = at
        call.is_error = bool(p.get("is_error", kind != kinds.CALL_COMPLETED))
        call.content = p.get("content", call.content)
        if call.content is None:
            call.content = p.get("reason") or None
        call.seconds = p.get("seconds", call.seconds)


def _layering(payload: dict[str, Any]) -> dict[str, Any]:
    """Which layer of policy decided (`org`, `team:payments`, `user:alice`, `grant`) and
    its version, and what log-only rules would have done (their notes), when recorded."""
    out: dict[str, Any] = {}
    if payload.get("layer"):
        out["layer"] = str(payload["layer"])
        if payload.get("layer_version"):
            out["layer"] += f" v{payload['layer_version']}"
    trials = payload.get("log_only")
    if isinstance(trials, list):
        out["log_only"] = [str(t.get("note", "")) for t in trials if isinstance(t, dict)]
    return out


def _extra(payload: dict[str, Any]) -> dict[str, Any]:
    known = {"call_id", "tool", "from", "to", "action", "by", "reason", "rule", "stage"}
    return {"details": {k: v for k, v in payload.items() if k not in known}}


@dataclass
class Timeline:
    chain: str
    session: dict[str, Any]
    calls: list[Call]
    events: list[AuditEvent]

    @property
    def running(self) -> bool:
        return any(not c.is_terminal for c in self.calls)

    def batches(self) -> list[list[Call]]:
        """The calls grouped by assistant message, in the order they arrived."""
        groups: dict[str, list[Call]] = {}
        for call in self.calls:
            groups.setdefault(call.batch_id or call.call_id, []).append(call)
        return [sorted(g, key=lambda c: c.batch_index) for g in groups.values()]


def build_timeline(chain: str) -> Timeline | None:
    events = list(AuditEvent.objects.for_chain(chain))
    if not events:
        return None
    session: dict[str, Any] = {}
    calls: dict[str, Call] = {}
    for event in events:
        if event.kind == kinds.SESSION_STARTED:
            session = {**event.payload, "started_at": event.created_at}
            continue
        call_id = event.payload.get("call_id")
        if call_id:
            _apply(calls.setdefault(call_id, Call(call_id=call_id)), event)
    return Timeline(chain=chain, session=session, calls=list(calls.values()), events=events)


# A session's reports that no call took, shown on its page (most recent first).
ORPHANS_SHOWN = 20


def orphan_reports(chain: str) -> list[AuditEvent]:
    """The session's client.report_orphaned events that name no call, newest first."""
    found = AuditEvent.objects.filter(chain=chain, kind=kinds.CLIENT_REPORT_ORPHANED)
    return [e for e in found.order_by("-seq")[:ORPHANS_SHOWN] if not e.payload.get("call_id")]


def session_started(chain: str) -> dict[str, Any]:
    """The session.started payload (agent, owner, mode, workspace ...): the chain's first
    event, read by its (chain, seq) key; empty if the chain does not start with one."""
    event = AuditEvent.objects.filter(chain=chain, seq=1, kind=kinds.SESSION_STARTED).first()
    return {**event.payload, "started_at": event.created_at} if event else {}


def received_seq(chain: str, call_id: str) -> int | None:
    """The seq of the call's call.received event in this chain, or None.

    Read by subject ("call:<id>") alone: the subject index finds the call's few events
    on both backends, where a query naming the chain or the kind too may walk those.
    """
    rows = AuditEvent.objects.filter(subject=f"call:{call_id}").values_list("chain", "kind", "seq")
    return next((seq for c, kind, seq in rows if c == chain and kind == kinds.CALL_RECEIVED), None)


@dataclass
class CallPage:
    """At most PAGE_CALLS calls of a session, oldest first, and the cursors around them.

    A cursor is the seq of a call.received event: `older` is the `before` of the page of
    older calls and `newer` the `after` of the page of newer ones (None: there are none).
    """

    calls: list[Call]
    older: int | None
    newer: int | None
    latest: bool


# The compact timeline's outcome filter: the events a call of that outcome has.
OUTCOME_FILTERS: dict[str, Q] = {
    "completed": Q(kind__in=[kinds.CALL_COMPLETED, kinds.CALL_REPORTED], payload__is_error=False),
    "error": Q(kind__in=[kinds.CALL_COMPLETED, kinds.CALL_REPORTED], payload__is_error=True)
    | Q(kind__in=[kinds.CALL_TIMED_OUT, kinds.CALL_OUTCOME_UNKNOWN, kinds.CALL_UNREPORTED]),
    "asked": Q(kind=kinds.CALL_APPROVAL_REQUESTED),
    "approved": Q(kind=kinds.CALL_APPROVED),
    "denied": Q(kind=kinds.CALL_DENIED),
    "rejected": Q(kind=kinds.CALL_REJECTED),
    "cancelled": Q(kind=kinds.CALL_CANCELLED),
    "expired": Q(kind=kinds.CALL_EXPIRED),
    "edited": Q(kind=kinds.CALL_EDITED),
    # A client's report of other input than the call was allowed.
    "mismatch": Q(kind=kinds.CALL_REPORTED, payload__input_matches=False),
}


def received_events(chain: str, *, tool: str = "", outcome: str = "") -> QuerySet[AuditEvent]:
    """The chain's call.received events, of calls to `tool` and with `outcome` (see
    OUTCOME_FILTERS) when given. An unknown outcome is the caller's to refuse."""
    received = AuditEvent.objects.filter(chain=chain, kind=kinds.CALL_RECEIVED)
    if tool:
        received = received.filter(payload__tool=tool)
    if outcome in OUTCOME_FILTERS:
        with_outcome = AuditEvent.objects.filter(OUTCOME_FILTERS[outcome], chain=chain)
        received = received.filter(subject__in=with_outcome.values("subject"))
    return received


def call_page(
    chain: str,
    *,
    before: int | None = None,
    after: int | None = None,
    tool: str = "",
    outcome: str = "",
) -> CallPage:
    """The calls received before seq `before`, after seq `after`, or (neither) the newest;
    only calls to `tool` and with `outcome` when given.

    Three indexed reads bounded by the page size, whatever the session's length: the
    page's call.received events (a (chain, seq) index range, newest or oldest first), one
    row on the other side (is there more?), and the other events of those calls, found by
    their subject ("call:<id>", shared by every event of a call; subject index). A call's
    later events (its decision, its result) may come long after other calls were received,
    so they are found by call, not by seq range. Events are applied by payload call_id.
    A filter adds a condition to the first two (the outcome one a subquery on the chain).
    """
    received = received_events(chain, tool=tool, outcome=outcome)
    if after is not None:
        rows = list(received.filter(seq__gt=after).order_by("seq")[: PAGE_CALLS + 1])
        more_newer, rows = len(rows) > PAGE_CALLS, rows[:PAGE_CALLS]
        more_older = received.filter(seq__lte=after).exists()
    else:
        page = received.filter(seq__lt=before) if before is not None else received
        rows = list(page.order_by("-seq")[: PAGE_CALLS + 1])
        more_older, rows = len(rows) > PAGE_CALLS, rows[:PAGE_CALLS][::-1]
        more_newer = before is not None and received.filter(seq__gte=before).exists()
    edge_older = rows[0].seq if rows else (after + 1 if after is not None else 0)
    edge_newer = rows[-1].seq if rows else (max(before - 1, 0) if before is not None else 0)
    return CallPage(
        calls=_calls_of(chain, rows),
        older=edge_older if more_older else None,
        newer=edge_newer if more_newer else None,
        latest=after is None and before is None,
    )


def _calls_of(chain: str, received: list[AuditEvent]) -> list[Call]:
    """The calls of these call.received events, each with all of its events, in order."""
    calls: dict[str, Call] = {}
    for event in received:
        if call_id := event.payload.get("call_id"):
            _apply(calls.setdefault(call_id, Call(call_id=call_id)), event)
    subjects = {e.subject for e in received if e.subject}
    if subjects:
        # By subject alone, so that both PostgreSQL and SQLite read the subject index (with
        # the chain in the query, either may walk the chain's (chain, seq) range instead);
        # the chain and order are then checked here.
        named = AuditEvent.objects.filter(subject__in=subjects)
        later = named.exclude(
            kind__in=[kinds.CALL_RECEIVED, kinds.CLIENT_REPORT_ORPHANED]
        ).order_by("seq")
        # A client can report a finished call again and again, each report a note on its
        # card: each call's newest few only, so that a page costs the same however many
        # (per call: reports of one call must not push another's off its card, such as
        # "the call it names was denied, not released").
        newest = (
            named.filter(kind=kinds.CLIENT_REPORT_ORPHANED)
            .annotate(
                rank=Window(RowNumber(), partition_by=[F("subject")], order_by=F("seq").desc())
            )
            .filter(rank__lte=ORPHANS_SHOWN)
            .values("pk")
        )
        reports = AuditEvent.objects.filter(pk__in=newest)
        for event in sorted([*later, *reports], key=lambda e: e.seq):
            call = calls.get(event.payload.get("call_id"))
            if call is not None and event.chain == chain and event.seq > received[0].seq:
                _apply(call, event)
    return list(calls.values())


# Calls a read of a transcript takes at once.
CALLS_READ = 200


def transcript_batches(chain: str) -> Iterator[list[Call]]:
    """The session's calls grouped by assistant message as `Timeline.batches` groups them
    (in the order their first calls arrived, each by batch_index), read CALLS_READ calls at
    a time: their call.received events through one cursor (PostgreSQL: a server-side one)
    ordered by batch, and the results and reports of those calls by subject. Holds one
    read's calls and one batch, never the session. Only what a transcript shows is applied
    (the call as received; its result, is_error, a report that does not match)."""
    batch = Coalesce(
        NullIf(KeyTextTransform("batch_id", "payload"), Value("")),
        KeyTextTransform("call_id", "payload"),
    )
    received = (
        AuditEvent.objects.filter(chain=chain, kind=kinds.CALL_RECEIVED)
        .annotate(
            batch_first=Window(Min("seq"), partition_by=[batch]),
            position=Coalesce(
                Cast(KeyTextTransform("batch_index", "payload"), BigIntegerField()), Value(0)
            ),
        )
        .order_by("batch_first", "position", "seq")
    )
    current: list[Call] = []
    # (QuerySet.iterator is a generator: closed below when the page is left early)
    rows = cast("Generator[AuditEvent]", received.iterator(chunk_size=CALLS_READ))
    try:
        while chunk := list(islice(rows, CALLS_READ)):
            for call in _with_results(chain, chunk):
                if current and (current[0].batch_id or current[0].call_id) != (
                    call.batch_id or call.call_id
                ):
                    yield current
                    current = []
                current.append(call)
    finally:
        rows.close()  # (a page left early: its cursor is closed now, not when collected)
    if current:
        yield current


def _with_results(chain: str, received: list[AuditEvent]) -> list[Call]:
    """The calls of these call.received events (in their order) with their results and
    reports applied, found by subject (as `_calls_of` finds a page's)."""
    calls: dict[str, Call] = {}
    for event in received:
        if call_id := event.payload.get("call_id"):
            _apply(calls.setdefault(call_id, Call(call_id=call_id)), event)
    subjects = {e.subject for e in received if e.subject}
    results = AuditEvent.objects.filter(subject__in=subjects, kind__in=RESULT_KINDS)
    for event in results.order_by("seq") if subjects else []:
        call = calls.get(event.payload.get("call_id"))
        if call is not None and event.chain == chain:
            _apply(call, event)
    return list(calls.values())


def json_list(items: Iterable[Any]) -> Generator[str]:
    """`json.dumps(list(items), indent=2, ensure_ascii=False)`, an item at a time."""
    opened = False
    for item in items:
        text = json.dumps(item, indent=2, ensure_ascii=False).replace("\n", "\n  ")
        yield ("[\n  " if not opened else ",\n  ") + text
        opened = True
    yield "\n]" if opened else "[]"


def openai_batch(batch: list[Call]) -> list[dict[str, Any]]:
    """One assistant message's calls as OpenAI messages: the calls, then their results."""
    messages: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": c.tool_use_id,
                    "type": "function",
                    "function": {"name": c.tool, "arguments": c.arguments},
                }
                for c in batch
            ],
        }
    ]
    messages += [
        {"role": "tool", "tool_call_id": c.tool_use_id, "content": c.content}
        for c in batch
        if c.content is not None
    ]
    return messages


def anthropic_batch(batch: list[Call]) -> list[dict[str, Any]]:
    """One assistant message's calls as Anthropic messages: the tool uses, then a user
    message of their results (if any)."""
    messages: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": c.tool_use_id,
                    "name": c.tool,
                    "input": c.parsed_arguments,
                }
                for c in batch
            ],
        }
    ]
    results = [
        {
            "type": "tool_result",
            "tool_use_id": c.tool_use_id,
            "content": c.content,
            "is_error": c.is_error,
        }
        for c in batch
        if c.content is not None
    ]
    if results:
        messages.append({"role": "user", "content": results})
    return messages


def openai_messages(timeline: Timeline) -> list[dict[str, Any]]:
    return [message for batch in timeline.batches() for message in openai_batch(batch)]


def anthropic_messages(timeline: Timeline) -> list[dict[str, Any]]:
    return [message for batch in timeline.batches() for message in anthropic_batch(batch)]
