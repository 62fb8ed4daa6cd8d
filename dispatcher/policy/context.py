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
    # (group, count) pairs; `group` is then "" and `approvals` their sum, or more where
    # rules of several layers combine (dispatcher.policy.layers.combined): the rest are
    # places any eligible reviewer may fill ("1 of sre and 1 more from anyone").
    groups: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Trial:
    """A log-only rule: evaluated and recorded ("would have asked"), deciding nothing."""

    action: str  # the list it sits in: allow | ask | deny
    rule: str


@dataclass(frozen=True)
class Layer:
    """One layer of policy above the owner's profile (the organization's, a team's), or the
    owner's own as the layers see it (dispatcher.policy.layers.stack). Active rule texts
    in the lists, quorum asks also in `quorum`, log-only rules in `trial`; `max_mode` is
    the layer's mode ceiling ("" for none)."""

    kind: str  # org | team | user
    name: str  # the team's name, the owner's username; "" for the organization
    version: int
    max_mode: str = ""
    allow: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    quorum: tuple[Quorum, ...] = ()
    trial: tuple[Trial, ...] = ()

    @property
    def whose(self) -> str:
        """`Rule 'x' in {whose} deny list`."""
        if self.kind == "org":
            return "the organization's"
        if self.kind == "team":
            return f"team {self.name}'s"
        return f"{self.name}'s"

    @property
    def label(self) -> str:
        """The layer and its version, as a decision names it: `org policy v7`."""
        if self.kind == "org":
            return f"org policy v{self.version}"
        if self.kind == "team":
            return f"team {self.name} policy v{self.version}"
        return f"profile v{self.version}"

    @property
    def key(self) -> str:
        """How provenance names the layer: `org`, `team:payments`, `user:alice`."""
        return "org" if self.kind == "org" else f"{self.kind}:{self.name}"


@dataclass(frozen=True)
class Profile:
    """A snapshot of the owner's permission profile, taken when the call is admitted, with
    the managed layers that bind it (`layers`: the organization's, then the team's).

    The lists hold active rule texts only (what the rule engine reads); the ask rules
    stored as quorum objects are also in `quorum`, with their requirement; log-only rules
    are in `trial` only.
    """

    mode: str
    allow: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    version: int = 1
    quorum: tuple[Quorum, ...] = ()
    trial: tuple[Trial, ...] = ()
    layers: tuple[Layer, ...] = ()


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
    # Where a decide-only call's client runs it, as its client reported (a hook's `cwd`:
    # Claude Code's shell keeps its directory after `cd`); "" when not reported.
    client_cwd: str = ""
    # The agent's configured workspace: the directory the paths of a client's tool asked
    # about through the permission prompt (`client_tool` naming Claude Code's `Edit`) are
    # confined to, as a hook's are to the project directory it reports. "" when the agent
    # has none (each session then gets a fresh directory on Harness's host, not the
    # client's): such a call is then never allowed without a person.
    agent_workspace: str = ""


BY_LENGTH = 200


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
    # The layer whose rule decided (`org`, `team:payments`, `user:alice`) and its version.
    layer: str = ""
    layer_version: int = 0
    # What log-only rules would have done (dispatcher.policy.layers.trials), recorded only.
    log_only: tuple[dict[str, Any], ...] = ()
    # The verdicts a reviewer must sign with a passkey (a step-up rule).
    step_up: tuple[str, ...] = ()
    # Approvals from several groups, each with its count (Quorum.groups).
    groups: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        # `by` is kept in 200 characters (ToolCall.decided_by, the audit event's actor;
        # PostgreSQL refuses more): a rule or a session grant naming a long command is
        # longer. `rule` keeps it whole.
        if len(self.by) > BY_LENGTH:
            object.__setattr__(self, "by", self.by[: BY_LENGTH - 1] + "\u2026")

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
        if self.layer:
            provenance |= {"layer": self.layer, "layer_version": self.layer_version}
        if self.log_only:
            provenance["log_only"] = list(self.log_only)
        if self.step_up:
            provenance["step_up"] = list(self.step_up)
        return provenance
