"""What answers a model's tool call: the call itself, or, when a reviewer edited it, the
call that replaced it (an edit of an edit followed), with the edits' notes before its
result. Read-only; every gateway that hands results back to a model uses it, so the
conversation says what really ran.
"""

from __future__ import annotations

from dispatcher.models import TERMINAL_STATUSES, Status, ToolCall


def follow_edits(calls: list[ToolCall]) -> None:
    """Set `.replaced_by` on each call a reviewer edited: the calls that replaced it, in
    order. One query per level of edits, none when no call was edited."""
    chains = {c.pk: [c] for c in calls if c.status == Status.EDITED}
    tips = {c.pk: c.pk for c in calls if c.status == Status.EDITED}  # tip id -> original
    while tips:
        found = ToolCall.objects.filter(edited_from_id__in=list(tips))
        next_tips = {}
        for replacement in found:
            original = tips[replacement.edited_from_id]  # type: ignore[index]
            chains[original].append(replacement)
            if replacement.status == Status.EDITED:
                next_tips[replacement.pk] = original
        tips = next_tips
    for call in calls:
        call.replaced_by = chains.get(call.pk, [call])[1:]  # type: ignore[attr-defined]


def answer_of(call: ToolCall) -> ToolCall:
    """The call whose state answers `call`'s tool_use_id: itself, or its last replacement."""
    chain: list[ToolCall] = getattr(call, "replaced_by", [])
    return chain[-1] if chain else call


def is_done(call: ToolCall) -> bool:
    return answer_of(call).status in TERMINAL_STATUSES


def answer_content(call: ToolCall) -> str:
    """What the model reads for `call`: for an edited call, each edit's note (what ran
    instead, stored as the edited call's content and audited with its call.edited)
    followed by the replacement's result."""
    chain: list[ToolCall] = getattr(call, "replaced_by", [])
    if not chain:
        return call.content
    notes = [call.content, *(c.content for c in chain[:-1])]
    return "\n\n".join([*notes, chain[-1].content])
