"""Teams and their members' roles.

A team owns agents (dispatcher.Agent.team) and may own MCP servers; each member holds one
or more roles in it (`reviewer`, `auditor`, `admin`), the same three roles that the
organization-wide Django groups give for every team (audit.roles). Models hold fields and
constraints only: every change is in `teams.services`, with its audit event, and who sees
what is decided in `teams.scope`.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

# Team names are typed in commands and shown everywhere: short, plain, no surprises.
TEAM_NAME = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$",
    "A team name is 1-63 letters, digits, dots, dashes or underscores, starting with a "
    "letter or digit.",
)
DEFAULT_TEAM = "default"


class TeamQuerySet(models.QuerySet["Team"]):
    def default(self) -> Team:
        """The team an install had before it had teams (made by the migration, or on first
        use): agents made without naming a team belong to it."""
        team, _ = self.get_or_create(is_default=True, defaults={"name": DEFAULT_TEAM})
        return team


class Team(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[TEAM_NAME])
    is_default = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    # Escalation: an ask of this team's agents that no one decided within this many
    # seconds is offered to the next tier as well: `escalate_to` (another team), or the
    # organization's reviewers when it is empty. None: no escalation.
    escalation_after = models.PositiveIntegerField(null=True, blank=True)
    escalate_to = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    objects = TeamQuerySet.as_manager()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"],
                condition=models.Q(is_default=True),
                name="team_one_default",
            )
        ]

    def __str__(self) -> str:
        return self.name


class TeamRole(models.TextChoices):
    REVIEWER = "reviewer"
    AUDITOR = "auditor"
    ADMIN = "admin"


class Source(models.TextChoices):
    """Who gave a membership: a person (by command or page) or the identity provider's
    group map, which manages only what it gave."""

    MANUAL = "manual"
    SSO = "sso"


class Membership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_memberships"
    )
    role = models.CharField(max_length=16, choices=TeamRole.choices)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.MANUAL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team__name", "user__username", "role"]
        constraints = [
            models.UniqueConstraint(fields=["team", "user", "role"], name="membership_unique")
        ]
        indexes = [models.Index(fields=["user", "role"])]

    def __str__(self) -> str:
        return f"{self.user} is {self.role} of {self.team}"
