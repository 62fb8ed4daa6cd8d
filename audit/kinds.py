"""The vocabulary of the audit log: every event kind, registered once.

A kind has a name (what is stored), the AuditChain counter it increments (if any), how it
reads in a timeline, and the timeline roles it plays (a decision, a reviewer's answer, the
call's result, a note on the call's card). Code names kinds by these constants (`kinds.CALL_RECEIVED`), so a typo is an
import error; `record_event` refuses a name that is not registered, so no event with a
misspelt kind is ever written. Registered the way pretix registers its log entry types.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    name: str
    reads: str  # how the event reads in a timeline
    counter: str = ""  # the AuditChain counter it increments ("" for none)
    decision: bool = False  # a decision at admission (the call's first answer)
    review: bool = False  # a reviewer's, the expiry's or the agent's answer to an ask
    result: bool = False  # the call's last event: what the model received
    note: bool = False  # shown on the call's card as a line of its own (votes, mismatches)

    def __str__(self) -> str:
        return self.name


REGISTRY: dict[str, Kind] = {}


def register(name: str, reads: str, **roles: str | bool) -> str:
    """Register a kind; returns its name, the constant code uses. Twice is an error."""
    if name in REGISTRY:
        raise ValueError(f"Audit event kind '{name}' is registered twice.")
    REGISTRY[name] = Kind(name, reads, **roles)  # type: ignore[arg-type]
    return name


def get(name: str) -> Kind:
    """The registered kind; raises UnknownKind for a name nobody registered."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownKind(name) from None


class UnknownKind(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(
            f"'{name}' is not a registered audit event kind (see audit/kinds.py): "
            "register it before recording it."
        )


# --- A call's life ---------------------------------------------------------------------
CALL_RECEIVED = register("call.received", "received", counter="calls")
CALL_ALLOWED = register("call.allowed", "allowed", counter="allowed", decision=True)
CALL_APPROVAL_REQUESTED = register(
    "call.approval_requested", "asked a reviewer", counter="asked", decision=True
)
CALL_APPROVED = register("call.approved", "approved", counter="approved", review=True)
CALL_DENIED = register(
    "call.denied", "denied", counter="denied", decision=True, review=True, result=True
)
CALL_REJECTED = register(
    "call.rejected", "rejected", counter="rejected", decision=True, result=True
)
CALL_CANCELLED = register(
    "call.cancelled", "cancelled", counter="cancelled", decision=True, review=True, result=True
)
CALL_EXPIRED = register("call.expired", "expired", counter="expired", review=True, result=True)
CALL_STARTED = register("call.started", "started")
CALL_COMPLETED = register("call.completed", "completed", counter="completed", result=True)
CALL_TIMED_OUT = register("call.timed_out", "timed out", counter="timed_out", result=True)
CALL_OUTCOME_UNKNOWN = register(
    "call.outcome_unknown", "outcome unknown", counter="outcome_unknown", result=True
)
CALL_REPORTED = register(
    "call.reported", "result reported by the client", counter="completed", result=True
)
CALL_UNREPORTED = register(
    "call.unreported", "never reported by the client", counter="outcome_unknown", result=True
)
CALL_EDITED = register("call.edited", "edited by a reviewer", review=True, result=True)
# The workspace changed between a command's preview and the apply of its approved effect:
# nothing applied, nothing run; a linked new call previews it again and asks again.
CALL_REPREVIEWED = register(
    "call.repreviewed", "previewed again: the workspace changed", result=True
)

# --- Agents, sessions, policy, reviewers, roles -----------------------------------------
AGENT_CREATED = register("agent.created", "agent created")
AGENT_REVOKED = register("agent.revoked", "agent revoked")
AGENT_TOKEN_ROTATED = register("agent.token_rotated", "agent token rotated")
AGENT_TOKEN_VOIDED = register(
    "agent.token_voided", "agent token voided: a person who was shown it was deactivated"
)
AGENT_HANDED_OVER = register(
    "agent.handed_over", "agent handed over to a sponsor: its owner was deactivated"
)
AGENT_TRANSFERRED = register("agent.transferred", "agent's owner, team or sponsor changed")
AGENT_AUTHORIZED = register("agent.authorized", "agent authorized by its owner (OAuth)")
AGENT_SIGNED_OUT = register("agent.signed_out", "agent's OAuth tokens revoked")
DEVICE_CODES_LOCKED = register(
    "agent.device_codes_locked", "device sign-in paused for a person: too many wrong codes"
)
SESSION_STARTED = register("session.started", "session started")
PROFILE_CHANGED = register("profile.changed", "mode or rules changed")
POLICY_CHANGED = register("policy.changed", "organization's or team's policy changed")
POLICY_PROPOSED = register("policy.proposed", "organization's policy change proposed")
POLICY_PROPOSAL_ACCEPTED = register(
    "policy.proposal_accepted", "organization's policy change accepted by a second admin"
)
GRANT_CREATED = register("grant.created", "allowed for the session")
GRANT_REVOKED = register("grant.revoked", "session grant revoked")
APPROVAL_DIGEST_MISMATCH = register(
    "approval.digest_mismatch", "decision refused: the arguments changed", note=True
)
APPROVAL_STEP_UP_REFUSED = register(
    "approval.step_up_refused", "decision refused: no valid passkey signature", note=True
)
APPROVAL_SECOND_FACTOR_MISSING = register(
    "approval.second_factor_missing",
    "decision refused: a link for a person who must have a second factor and has none",
    note=True,
)
APPROVAL_VOTE = register("approval.vote", "approved: one vote towards the quorum", note=True)
APPROVAL_ESCALATED = register(
    "approval.escalated",
    "escalated: no one decided in time, the next tier is asked too",
    note=True,
)
APPROVAL_VOTE_DISCARDED = register(
    "approval.vote_discarded",
    "vote discarded: its reviewer left before the quorum completed",
    note=True,
)
APPROVAL_EDIT_REFUSED = register(
    "approval.edit_refused", "edit refused: the edited call would not be allowed"
)
NOTIFICATION_CHANNEL_CHANGED = register(
    "notification.channel_changed", "notification channel changed"
)
ROLE_GRANTED = register("role.granted", "role granted")
ROLE_REMOVED = register("role.removed", "role removed")
TEAM_CREATED = register("team.created", "team created")
TEAM_MEMBER_ADDED = register("team.member_added", "team role given")
TEAM_MEMBER_REMOVED = register("team.member_removed", "team role taken")
TEAM_ESCALATION_SET = register("team.escalation_set", "team escalation changed")
USER_DEACTIVATED = register(
    "user.deactivated",
    "user deactivated: sockets closed, votes and links void, agents' tokens revoked or handed over",
)
# --- People signing in (identity/, docs/identity.md) ---------------------------------------
USER_SIGNED_IN_SSO = register("user.signed_in_sso", "signed in through single sign-on")
USER_BREAK_GLASS = register(
    "user.break_glass", "signed in with a break-glass password (single sign-on only): admins told"
)
SSO_REFUSED = register(
    "sso.refused", "single sign-on refused: an unverified email matches an existing account"
)
SSO_LINK_REFUSED = register(
    "sso.link_refused",
    "single sign-on refused: a verified email matches a privileged account, which links "
    "its provider itself",
)
SSO_LINKED = register(
    "sso.linked",
    "an identity provider's person linked to an account: by a verified email, or "
    "connected by the account's owner",
)
USER_SIGNED_OUT_EVERYWHERE = register("user.signed_out_everywhere", "signed out everywhere")
SESSION_EXPIRED = register("user.session_expired", "sign-in ended: idle or too old")

# --- What a client that runs its own tools tells about its session (Claude Code's hooks) --
CLIENT_SESSION_STARTED = register("client.session_started", "client session started")
CLIENT_PROMPT = register("client.prompt", "the user sent a prompt")
CLIENT_STOPPED = register("client.stopped", "the client finished its answer")
CLIENT_SESSION_ENDED = register("client.session_ended", "client session ended")
CLIENT_REPORT_ORPHANED = register(
    "client.report_orphaned",
    "the client reported a tool run that matches no call Harness allowed",
    note=True,
)
# --- Tool sources: upstream MCP servers ----------------------------------------------------
MCP_SERVER_ADDED = register("mcp_server.added", "MCP server registered")
MCP_SERVER_REFRESHED = register("mcp_server.refreshed", "MCP server's tools listed again")
MCP_SERVER_REMOVED = register("mcp_server.removed", "MCP server removed")
MCP_TOOL_ACCEPTED = register("mcp_tool.accepted", "changed MCP tool definition accepted")
MCP_TOOL_CHANGED = register("mcp_tool.changed", "MCP tool listed otherwise upstream: held")


def names_where(role: str) -> frozenset[str]:
    """The kinds playing a timeline role: "decision", "review", "result" or "note"."""
    return frozenset(k.name for k in REGISTRY.values() if getattr(k, role))
