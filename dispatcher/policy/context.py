"""The values that flow through the pipeline: a call as policy sees it, and a decision."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dispatcher.tools.base import Tool

Action = Literal["allow", "deny", "ask", "cancel"]


@dataclass(frozen=True)
class Quorum:
    """An ask rule that needs `approvals` approvals from distinct reviewers (of `group`,
    a Django group, when it is set)."""

    rule: str
    approvals: int
    group: str = ""
    # The verdicts ("approve", "deny") a reviewer must sign with a passkey (step-up).
    step_up: tuple[str, ...] = ()
    # Several groups as several counts ("1 of payments-oncall and 1 of security"):
    # (group, count) pairs; `approvals` is then their sum and `group` is "".
    groups: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Profile:
    """A snapshot of the owner's permission profile, taken when the call is admitted.

    The lists hold rule texts only (what the rule engine reads); the ask rules stored as
    quorum objects are also in `quorum`, with their requirement.
    """

    mode: str
    allow: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    version: int = 1
    quorum: tuple[Quorum, ...] = ()


@dataclass(frozen=True)
class CallContext:
    """One call as listeners and guards see it. Read-only: nothing here may be rewritten."""

    call_id: str
    session_id: str
    tool: Tool
    name: str
    arguments: dict[str, Any]
    workspace: Path
    mode: str  # the session's effective mode (never wider than the owner's)
    username: str
    agent_name: str
    profile: Profile = field(default_factory=lambda: Profile(mode="standard"))
    agent_active: bool = True
    # False when the session is known to hold no active grant (read with the session), so
    # the session_grants listener need not look.
    may_have_grants: bool = True


@dataclass(frozen=True)
class Decision:
    """What a pre-execute listener answered, and who/why (provenance)."""

    action: Action
    by: str  # "mode:standard", "rule:allow:run_command(npm test *)", "guard:workspace_confinement", "user:alice"
    reason: str
    rule: str = ""
    # An ask that needs more than one reviewer (quorum), optionally from a named group.
    approvals: int = 1
    group: str = ""
    # The verdicts a reviewer must sign with a passkey (a step-up rule).
    step_up: tuple[str, ...] = ()
    # Approvals from several groups, each with its count (Quorum.groups).
    groups: tuple[tuple[str, int], ...] = ()

    def as_provenance(self) -> dict[str, Any]:
        provenance: dict[str, Any] = {
            "action": self.action,
            "by": self.by,
            "reason": self.reason,
            "rule": self.rule,
        }
        if self.approvals > 1 or self.group:
            provenance |= {"approvals": self.approvals, "group": self.group}
        if self.groups:
            provenance["groups"] = [{"group": g, "count": n} for g, n in self.groups]
        if self.step_up:
            provenance["step_up"] = list(self.step_up)
        return provenance
