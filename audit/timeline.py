"""A session as the log tells it: its calls, decisions, stage times and results.

Built from AuditEvent rows alone (never from the dispatcher's tables), so what the
timeline, the replay and the transcript show is exactly what the log can prove.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .models import AuditEvent

DECISION_KINDS = {
    "call.allowed",
    "call.approval_requested",
    "call.denied",
    "call.rejected",
    "call.cancelled",
}
REVIEW_KINDS = {"call.approved", "call.denied", "call.cancelled", "call.expired"}
RESULT_KINDS = {
    "call.completed",
    "call.timed_out",
    "call.outcome_unknown",
    "call.denied",
    "call.rejected",
    "call.cancelled",
    "call.expired",
}
TERMINAL = {
    "completed",
    "timed_out",
    "outcome_unknown",
    "denied",
    "rejected",
    "cancelled",
    "expired",
}


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
    def parsed_arguments(self) -> Any:
        try:
            return json.loads(self.arguments)
        except ValueError:
            return {"_unparsed_arguments": self.arguments}


def _apply(call: Call, event: AuditEvent) -> None:
    p, kind, at = event.payload, event.kind, event.created_at
    call.events.append(event)
    if kind == "call.received":
        call.tool = p.get("tool", "")
        call.tool_use_id = p.get("tool_use_id", "")
        call.arguments = p.get("arguments", "")
        call.digest = p.get("digest", "")
        call.dialect = p.get("dialect", "")
        call.batch_id = p.get("batch_id", "")
        call.batch_index = p.get("batch_index", 0)
        call.times["received"] = at
        return
    call.status = p.get("to", call.status)
    provenance = {k: p.get(k, "") for k in ("action", "by", "reason", "rule", "stage")}
    if kind in REVIEW_KINDS and "asked" in call.times:
        call.review = {**provenance, "actor": event.actor, **_extra(p)}
        call.times["reviewed"] = at
    elif kind in DECISION_KINDS:
        call.decision = {**provenance, "actor": event.actor}
        call.times["decided"] = at
    if kind == "call.approval_requested":
        call.presentation = p.get("presentation")
        call.times["asked"] = at
    if p.get("to") == "queued":
        call.times["queued"] = at
    if kind == "call.started":
        call.times["started"] = at
    if kind in RESULT_KINDS:
        call.times["finished"] = at
        call.is_error = bool(p.get("is_error", kind != "call.completed"))
        call.content = p.get("content", call.content)
        if call.content is None:
            call.content = p.get("reason") or None
        call.seconds = p.get("seconds", call.seconds)


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
        if event.kind == "session.started":
            session = {**event.payload, "started_at": event.created_at}
            continue
        call_id = event.payload.get("call_id")
        if call_id:
            _apply(calls.setdefault(call_id, Call(call_id=call_id)), event)
    return Timeline(chain=chain, session=session, calls=list(calls.values()), events=events)


def openai_messages(timeline: Timeline) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for batch in timeline.batches():
        messages.append(
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
        )
        messages += [
            {"role": "tool", "tool_call_id": c.tool_use_id, "content": c.content}
            for c in batch
            if c.content is not None
        ]
    return messages


def anthropic_messages(timeline: Timeline) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for batch in timeline.batches():
        messages.append(
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
        )
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


def replay_events(timeline: Timeline) -> list[dict[str, Any]]:
    """The events as the replay script reads them (from json_script, never as HTML)."""
    return [
        {
            "seq": e.seq,
            "kind": e.kind,
            "actor": e.actor,
            "subject": e.subject,
            "at": e.created_at.isoformat(),
            "payload": e.payload,
        }
        for e in timeline.events
    ]
