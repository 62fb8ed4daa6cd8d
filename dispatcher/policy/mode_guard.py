"""The mode ceiling guard: what the session's mode can never let run, whoever allowed it.

Admission already asked the mode; this guard matters when it is re-run by the worker:
an owner switched to `locked` or `read_only`, or an agent revoked, after a call was
queued or while it waited for a reviewer, must stop it before it runs.
"""

from __future__ import annotations

from dispatcher.policy.context import CallContext
from dispatcher.policy.layers import ceiling_note
from dispatcher.policy.models import Mode


def mode_ceiling(call: CallContext) -> str | None:
    """The session's mode here is already narrowed by every layer's ceiling
    (dispatcher.policy.layers.effective_mode), so no rule or grant lifts one."""
    if not call.agent_active:
        return f"The agent '{call.agent_name}' was revoked; none of its calls run any more."
    if call.mode == Mode.LOCKED:
        return "The session is in locked mode: no tool runs." + ceiling_note(call)
    if call.mode == Mode.READ_ONLY and not call.tool.read_only:
        return (
            f"The session is in read_only mode and '{call.tool.name}' can change things."
            + ceiling_note(call)
        )
    if call.mode not in _MODES:
        return f"Unknown permission mode '{call.mode}'; denied (fail closed)."
    return None


_MODES = frozenset(Mode.values)  # (Mode.values makes a new list at each read)
