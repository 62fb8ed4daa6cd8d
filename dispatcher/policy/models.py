"""Modes, permission profiles with their versions, and session grants.

Their tables keep the names they had in the dispatcher app (`db_table`): the models moved
with SeparateDatabaseAndState, so an existing database keeps working. Every change to them
is in `dispatcher.policy.profiles` and `dispatcher.policy.grants`.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class Mode(models.TextChoices):
    READ_ONLY = "read_only", "Read only"
    STANDARD = "standard", "Standard"
    TRUSTED = "trusted", "Trusted"
    LOCKED = "locked", "Locked"


# From least to most permissive; a session may only move left of its owner's mode.
MODE_ORDER = [Mode.LOCKED, Mode.READ_ONLY, Mode.STANDARD, Mode.TRUSTED]


def narrower_mode(a: str, b: str) -> str:
    return a if MODE_ORDER.index(Mode(a)) <= MODE_ORDER.index(Mode(b)) else b


class PermissionProfile(models.Model):
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="permission_profile"
    )
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.STANDARD)
    allow = models.JSONField(default=list, blank=True)
    ask = models.JSONField(default=list, blank=True)
    deny = models.JSONField(default=list, blank=True)
    version = models.PositiveIntegerField(default=1)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "dispatcher_permissionprofile"

    def __str__(self) -> str:
        return f"{self.user} ({self.mode})"


class ProfileVersion(models.Model):
    """One saved state of a user's permission profile: who changed it, when, and the diff."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="profile_versions"
    )
    version = models.PositiveIntegerField()
    mode = models.CharField(max_length=16, choices=Mode.choices)
    allow = models.JSONField(default=list, blank=True)
    ask = models.JSONField(default=list, blank=True)
    deny = models.JSONField(default=list, blank=True)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    changed_at = models.DateTimeField(auto_now_add=True)
    diff = models.JSONField(default=dict, blank=True)

    class Meta:
        db_table = "dispatcher_profileversion"
        ordering = ["-version"]
        constraints = [
            models.UniqueConstraint(fields=["user", "version"], name="profileversion_unique")
        ]

    def __str__(self) -> str:
        return f"{self.user} v{self.version}"


class SessionGrantQuerySet(models.QuerySet["SessionGrant"]):
    def active(self) -> SessionGrantQuerySet:
        """Not revoked, and the session's agent can still call in it (a revoked agent ends
        it; so does the agent's leaving the session's team, AgentSession.left_at)."""
        return self.filter(
            revoked_at__isnull=True,
            session__agent__is_active=True,
            session__left_at__isnull=True,
        )


class SessionGrant(models.Model):
    """An allow rule scoped to one session, given by a reviewer who approved a call."""

    session = models.ForeignKey(
        "dispatcher.AgentSession", on_delete=models.CASCADE, related_name="grants"
    )
    rule = models.CharField(max_length=2000)
    tool = models.CharField(max_length=200)
    call = models.ForeignKey(
        "dispatcher.ToolCall", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    granted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )

    objects = SessionGrantQuerySet.as_manager()

    class Meta:
        db_table = "dispatcher_sessiongrant"
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["session", "tool", "revoked_at"])]

    def __str__(self) -> str:
        return f"{self.rule} in {self.session_id}"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class LayerKind(models.TextChoices):
    ORG = "org", "Organization"
    TEAM = "team", "Team"


class PolicyLayer(models.Model):
    """The organization's policy (one row, `team` empty) or one team's: allow / ask / deny
    rule entries and an optional mode ceiling, versioned like a PermissionProfile.

    `revision` changes with every save, whatever the version: admission reads it with the
    session and keeps parsed layers by it (dispatcher.policy.layers), so a layer is read
    again only after it changed. Every change is in `dispatcher.policy.layers`.
    """

    kind = models.CharField(max_length=8, choices=LayerKind.choices)
    team = models.OneToOneField(
        "teams.Team",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="policy_layer",
    )
    max_mode = models.CharField(max_length=16, choices=Mode.choices, blank=True)
    allow = models.JSONField(default=list, blank=True)
    ask = models.JSONField(default=list, blank=True)
    deny = models.JSONField(default=list, blank=True)
    version = models.PositiveIntegerField(default=0)
    revision = models.UUIDField(default=uuid.uuid4)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["kind"], condition=models.Q(kind="org"), name="policylayer_one_org"
            ),
            models.CheckConstraint(
                condition=(models.Q(kind="org", team__isnull=True))
                | models.Q(kind="team", team__isnull=False),
                name="policylayer_team_iff_team_kind",
            ),
        ]

    def __str__(self) -> str:
        return "organization" if self.kind == LayerKind.ORG else f"team {self.team}"


class LayerVersion(models.Model):
    """One saved state of a policy layer: who changed it, why, when, and the diff."""

    layer = models.ForeignKey(PolicyLayer, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    document = models.JSONField(default=dict)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor = models.CharField(max_length=200, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.TextField(blank=True)
    diff = models.JSONField(default=dict, blank=True)
    changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-version"]
        constraints = [
            models.UniqueConstraint(fields=["layer", "version"], name="layerversion_unique")
        ]

    def __str__(self) -> str:
        return f"{self.layer} v{self.version}"


class ProposalStatus(models.TextChoices):
    PENDING = "pending"
    ACCEPTED = "accepted"
    WITHDRAWN = "withdrawn"
    SUPERSEDED = "superseded"


class LayerProposal(models.Model):
    """A change to the organization's layer waiting for a second org admin
    (HARNESS_POLICY_TWO_PERSON): the whole proposed document, on top of `base_version`."""

    layer_kind = models.CharField(max_length=8, choices=LayerKind.choices, default=LayerKind.ORG)
    document = models.JSONField(default=dict)
    base_version = models.PositiveIntegerField()
    reason = models.TextField()
    diff = models.JSONField(default=dict, blank=True)
    proposed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    status = models.CharField(
        max_length=16, choices=ProposalStatus.choices, default=ProposalStatus.PENDING
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"proposal {self.pk} ({self.status})"
