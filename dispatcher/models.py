"""Agents, sessions and tool calls.

Models hold fields, constraints and read vocabulary only; agents and sessions change in
`dispatcher.agents`, calls in `dispatcher.admission` and `dispatcher.transitions`.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from dispatcher.policy.models import Mode

# How the token prefix of a client's signed-in agent signed out starts (a prefix a new
# token gets is hexadecimal, so none starts so): its bearer token then is one nobody was
# shown (dispatcher.agents._new_sign_in), so pages say "signed out", never the prefix.
SIGNED_OUT_PREFIX = "out"


class Agent(models.Model):
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="agents"
    )
    # The team the agent works for: its reviewers decide its asks, its auditors read its
    # sessions, its admins manage it (teams.scope).
    team = models.ForeignKey("teams.Team", on_delete=models.PROTECT, related_name="agents")
    # The person accountable when the owner leaves (optional).
    sponsor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="sponsored_agents",
    )
    name = models.CharField(max_length=100)
    token_prefix = models.CharField(max_length=16, unique=True)
    token_hash = models.CharField(max_length=64)
    # The people a token of this agent was ever shown to (user ids: who created it or
    # rotated its token in the dashboard; none when made at the command line or signed
    # in). Each held a credential that acted as the agent, so separation of duties counts
    # them all (approvals.people_behind), also for calls made before a later rotation.
    token_holders = models.JSONField(default=list, blank=True)
    # A token voided because one of its holders left (dispatcher.agents.void_tokens_shown_to):
    # the username of the person whose deactivation voided it, when, and the hash the voided
    # token had, so that whoever still sends it is told why it stopped (never that a random
    # guess was close). All cleared when the token is rotated.
    token_voided_because = models.CharField(max_length=150, blank=True, default="")
    token_voided_at = models.DateTimeField(null=True, blank=True)
    voided_token_hash = models.CharField(max_length=64, blank=True, default="")
    workspace = models.CharField(
        max_length=1000,
        blank=True,
        help_text="Fixed workspace directory; empty gives each session a fresh one.",
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="agent_unique_name_per_owner")
        ]

    def __str__(self) -> str:
        return (
            f"{self.name} (signed out)"
            if self.signed_out
            else f"{self.name} ({self.token_prefix}…)"
        )

    @property
    def signed_out(self) -> bool:
        """Whether the agent's bearer token is the one a sign-out gave it, never shown."""
        return self.token_prefix.startswith(SIGNED_OUT_PREFIX)


class AgentSession(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="sessions")
    # The team the agent worked for when the session started (dispatcher.agents sets it
    # from the agent's row, never changes it): its auditors read the session, its
    # reviewers decide its asks (teams.scope). An agent moved to another team later
    # (agents.transfer_agent) takes no session with it: what it did under this team
    # stays this team's record, and its new calls go to new sessions of its new team.
    team = models.ForeignKey("teams.Team", on_delete=models.PROTECT, related_name="sessions")
    title = models.CharField(max_length=200, blank=True)
    mode = models.CharField(max_length=16, choices=Mode.choices)
    workspace = models.CharField(max_length=1000)
    # Which way the session came in, and the client's own id for it (a Claude Code
    # session_id, an MCP session id): one client session is one Harness session.
    client = models.CharField(max_length=32, default="api")
    external_id = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # When its agent left the session's team (agents.transfer_agent): from then on it takes
    # no call, even once the agent is back in that team (its grants with it); the client's
    # next call starts a new session, with the same client id if it sends one.
    left_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["agent", "team", "client", "external_id"],
                condition=~models.Q(external_id="") & models.Q(left_at__isnull=True),
                name="agentsession_unique_external_id",
            )
        ]

    def __str__(self) -> str:
        return f"{self.agent.name}: {self.title or self.id}"


class Status(models.TextChoices):
    RECEIVED = "received"
    REJECTED = "rejected"
    DENIED = "denied"
    CANCELLED = "cancelled"
    PENDING_APPROVAL = "pending_approval"
    EXPIRED = "expired"
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    TIMED_OUT = "timed_out"
    OUTCOME_UNKNOWN = "outcome_unknown"
    # Decide-only calls (the client runs the tool): allowed and handed back, then what the
    # client reported, or nothing within the lease.
    RELEASED = "released"
    REPORTED = "reported"
    UNREPORTED = "unreported"
    # A reviewer changed the arguments: this call ends, a linked new call replaces it.
    EDITED = "edited"


class Executor(models.TextChoices):
    HARNESS = "harness"  # a Celery worker runs the tool
    CLIENT = "client"  # decide-only: the client runs it and may report the result


TERMINAL_STATUSES = frozenset(
    {
        Status.REJECTED,
        Status.DENIED,
        Status.CANCELLED,
        Status.EXPIRED,
        Status.COMPLETED,
        Status.TIMED_OUT,
        Status.OUTCOME_UNKNOWN,
        Status.REPORTED,
        Status.UNREPORTED,
        Status.EDITED,
    }
)

# Every transition the services may make: (from, to).
TRANSITIONS = frozenset(
    {
        (Status.RECEIVED, Status.REJECTED),
        (Status.RECEIVED, Status.DENIED),
        (Status.RECEIVED, Status.CANCELLED),
        (Status.RECEIVED, Status.PENDING_APPROVAL),
        (Status.RECEIVED, Status.QUEUED),
        (Status.PENDING_APPROVAL, Status.QUEUED),
        (Status.PENDING_APPROVAL, Status.DENIED),
        (Status.PENDING_APPROVAL, Status.EXPIRED),
        (Status.PENDING_APPROVAL, Status.CANCELLED),
        # The worker re-runs the guards before it claims the call: time has passed.
        (Status.QUEUED, Status.DENIED),
        (Status.QUEUED, Status.RUNNING),
        (Status.RUNNING, Status.COMPLETED),
        (Status.RUNNING, Status.TIMED_OUT),
        (Status.RUNNING, Status.OUTCOME_UNKNOWN),
        # Decide-only calls: released to the client instead of queued for a worker.
        (Status.RECEIVED, Status.RELEASED),
        (Status.PENDING_APPROVAL, Status.RELEASED),
        (Status.RELEASED, Status.REPORTED),
        (Status.RELEASED, Status.UNREPORTED),
        (Status.PENDING_APPROVAL, Status.EDITED),
        # The workspace changed between a preview and its apply: previewed again as a
        # linked new call that asks again (dispatcher.previews).
        (Status.QUEUED, Status.EDITED),
    }
)


class Dialect(models.TextChoices):
    NATIVE = "native"
    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    MCP = "mcp"  # a tools/call on the MCP gateway


class ToolCallQuerySet(models.QuerySet["ToolCall"]):
    def awaiting_approval(self) -> ToolCallQuerySet:
        return self.filter(status=Status.PENDING_APPROVAL)

    def lease_expired(self, now: object) -> ToolCallQuerySet:
        return self.filter(status=Status.RUNNING, lease_until__lt=now)

    def report_overdue(self, now: object) -> ToolCallQuerySet:
        """Released to the client and not reported within the lease."""
        return self.filter(status=Status.RELEASED, lease_until__lt=now)


class ToolCall(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(AgentSession, on_delete=models.PROTECT, related_name="calls")
    tool_use_id = models.CharField(max_length=200)
    name = models.CharField(max_length=200)
    # The exact arguments as received (text), their parsed form, and the SHA-256 of their
    # canonical JSON. Never rewritten after receive.
    raw_arguments = models.TextField()
    arguments = models.JSONField(null=True)
    digest = models.CharField(max_length=64)
    dialect = models.CharField(max_length=16, choices=Dialect.choices)
    batch_id = models.UUIDField(db_index=True)
    batch_index = models.PositiveIntegerField()
    # (Both columns have database defaults: a process of the release before them, during a
    # rolling upgrade, still inserts calls.)
    # How many calls the message admitted into the batch; 0 when not known (a reviewer's
    # edit puts its replacement into an existing batch). A finished call of a batch of one
    # has nothing after it to start.
    batch_size = models.PositiveIntegerField(default=0, db_default=0)
    # Every call of the batch that will run was sent to the workers at admission (all
    # auto-allowed, one concurrency-safe run, none waiting for a reviewer): a finished
    # call has nothing after it to start, and nothing of the batch is read after it.
    batch_all_sent = models.BooleanField(default=False, db_default=False)
    executor = models.CharField(max_length=16, choices=Executor.choices, default=Executor.HARNESS)
    # An edited call's replacement points at the call it replaced.
    edited_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="edits"
    )

    status = models.CharField(max_length=20, choices=Status.choices, default=Status.RECEIVED)
    decision = models.CharField(max_length=16, blank=True)  # allow | deny | ask | cancel | reject
    decided_by = models.CharField(
        max_length=200, blank=True
    )  # "mode:standard", "guard:...", "user:alice"
    reason = models.TextField(blank=True)
    provenance = models.JSONField(default=dict, blank=True)

    content = models.TextField(blank=True)
    is_error = models.BooleanField(default=False)
    repeat_count = models.PositiveIntegerField(default=1)

    created_at = models.DateTimeField(auto_now_add=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)  # last time a Celery message was sent
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    timings = models.JSONField(default=dict, blank=True)

    objects = ToolCallQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "batch_index"]
        constraints = [
            models.UniqueConstraint(
                fields=["session", "tool_use_id"], name="toolcall_unique_tool_use_id"
            ),
        ]
        indexes = [
            models.Index(fields=["status", "queued_at"]),
            models.Index(fields=["status", "lease_until"]),
            # A session's history (reviewers' context) and its repeat-call counts. batch_id is
            # in it so that the history's "earlier, or in its batch" test reads no row it
            # skips (SQLite reached it through each row's large arguments: 2.7 s for a
            # queue of 500 asks of 100 KB).
            models.Index(
                fields=["session", "created_at", "batch_id"], name="toolcall_session_created_b"
            ),
            models.Index(fields=["session", "digest"], name="toolcall_session_digest"),
            # The overview's calls per hour, agents and tools: ranges of recent calls.
            models.Index(fields=["created_at"], name="toolcall_created_at"),
        ]

    def __str__(self) -> str:
        return f"{self.name} [{self.status}]"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class Preview(models.Model):
    """What a run_command that asked would do, previewed before a reviewer saw it
    (dispatcher.tools.preview; issue 36): the effect they approve and Harness applies.

    `effect_digest` is empty when no preview could be made (`note` says why); `outcome`
    says what happened after approval: the effect applied, the command run for real (the
    preview hit a limit or needed the network), or previewed again (the workspace
    changed). `kept`: the upper layer is still on disk (removed once the call ends)."""

    class Outcome(models.TextChoices):
        APPLIED = "applied"
        APPLY_FAILED = "apply_failed"  # the workspace changed under the apply: said so
        RAN = "ran"
        REPREVIEWED = "repreviewed"

    call = models.OneToOneField(ToolCall, on_delete=models.PROTECT, related_name="preview")
    command_digest = models.CharField(max_length=64)
    effect_digest = models.CharField(max_length=64, blank=True)
    effect = models.JSONField(default=dict, blank=True)
    appliable = models.BooleanField(default=False)
    note = models.TextField(blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True)
    kept = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"preview of {self.call_id} ({self.effect_digest[:12] or 'none'})"
