"""Where a call's time goes, seam by seam, from its own audit events (S0, S5).

Each timed call is marked with its tool_use_id and the client's wall-clock times around
it (this machine's one clock: the client, daphne and the worker read it alike); the
seams are the client's start to the first audit event, each event to the next (their
`created_at`, stamped by the process that made the change), and the last to the
client's answer. A bench note, not a result: it says which part to look at, as
`bench.peer.stages_note` does for S14.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

# (tool_use_id, the client's wall-clock time when it started, when it had the answer)
Mark = tuple[str, float, float]


def seams_note(label: str, marks: Sequence[Mark], kinds: Sequence[str], start: str) -> str:
    """`label`'s seams over `marks`, through the audit events `kinds` (in order), medians;
    `start` names what the client did first (its request, a reviewer's decision)."""
    from audit.models import AuditEvent
    from dispatcher.models import ToolCall

    by_id = dict(
        ToolCall.objects.filter(tool_use_id__in=[m[0] for m in marks]).values_list(
            "tool_use_id", "pk"
        )
    )
    times: dict[str, dict[str, float]] = {}
    events = AuditEvent.objects.filter(
        subject__in=[f"call:{pk}" for pk in by_id.values()], kind__in=list(kinds)
    ).values_list("subject", "kind", "created_at")
    for subject, kind, at in events:
        times.setdefault(subject, {})[kind] = at.timestamp()
    names = [f"{start} to {kinds[0]}"]
    names += [f"{a} to {b}" for a, b in zip(kinds, kinds[1:], strict=False)]
    names += [f"{kinds[-1]} to the answer"]
    spans: dict[str, list[float]] = {name: [] for name in names}
    for tool_use_id, started, answered in marks:
        seen = times.get(f"call:{by_id.get(tool_use_id)}", {})
        if not all(kind in seen for kind in kinds):
            continue
        points = [started, *(seen[kind] for kind in kinds), answered]
        for name, (a, b) in zip(names, zip(points, points[1:], strict=False), strict=True):
            spans[name].append(b - a)
    counted = len(spans[names[0]])
    if not counted:
        return f"{label} seams: no audit times found"
    parts = ", ".join(f"{name} {statistics.median(v) * 1e3:.2f}" for name, v in spans.items())
    return f"{label} seams from the calls' audit events ({counted} calls, medians, ms): {parts}"
