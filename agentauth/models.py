"""Which agent each OAuth credential stands for.

django-oauth-toolkit keeps the clients (`Application`), codes (`Grant`, `DeviceGrant`)
and tokens; these rows tie them to Harness's agents. An agent made by consent
(`AgentClient`) has a person behind it: the owner who approved the client, the client,
the team it works for, the profile it runs under and how the client was registered. Every code and access token
names its agent (`PendingAgent`, `AgentToken`), so a token resolves to exactly the agent
the person approved, and revoking that agent (or deactivating its owner) stops every
token at once.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from dispatcher.models import Agent
from dispatcher.policy.models import Mode


class Registration(models.TextChoices):
    CIMD = "cimd", "Client ID Metadata Document"
    DYNAMIC = "dcr", "Dynamic client registration"
    MANUAL = "manual", "Registered by an admin"
    DEVICE = "device", "Device sign-in (harness-hook login)"


class AgentClient(models.Model):
    """An agent made by a person's consent to a client."""

    agent = models.OneToOneField(Agent, on_delete=models.CASCADE, related_name="oauth_client")
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oauth_agents"
    )
    application = models.ForeignKey(
        "oauth2_provider.Application", on_delete=models.CASCADE, related_name="harness_agents"
    )
    # The team the agent works for (the person is a member of it).
    team = models.ForeignKey("teams.Team", on_delete=models.PROTECT, related_name="+")
    # The profile the agent runs under: its owner's, with the mode narrowed to this one.
    mode = models.CharField(max_length=16, choices=Mode.choices)
    registered_via = models.CharField(max_length=16, choices=Registration.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "application", "team"],
                name="agentclient_one_per_owner_client_and_team",
            )
        ]

    def __str__(self) -> str:
        return f"agent {self.agent_id} of user {self.owner_id} for client {self.application_id}"


class PendingAgent(models.Model):
    """The agent an authorization code or a device code was approved for."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+")
    grant = models.OneToOneField(
        "oauth2_provider.Grant", null=True, on_delete=models.CASCADE, related_name="harness"
    )
    device_grant = models.OneToOneField(
        "oauth2_provider.DeviceGrant",
        null=True,
        on_delete=models.CASCADE,
        related_name="harness",
    )

    def __str__(self) -> str:
        return f"code for agent {self.agent_id}"


class DeviceResource(models.Model):
    """The resource (RFC 8707) a device code was asked for (agentauth.validators
    device_code_resource): its token is for that one only, and so are the tokens refreshed
    from it. django-oauth-toolkit's DeviceGrant keeps none."""

    device_grant = models.OneToOneField(
        "oauth2_provider.DeviceGrant", on_delete=models.CASCADE, related_name="harness_resource"
    )
    resource = models.TextField()
    # The network the code was asked from (agentauth.views.device_network): a network's
    # share of its client's pending codes is counted by it (agentauth.views._pending_full).
    network = models.CharField(max_length=64, blank=True, default="", db_index=True)
    # The wider block holding that network (agentauth.views.device_aggregate: an IPv4 /16,
    # an IPv6 /32), whose share is counted too: one holder of many /48s fills no more.
    aggregate = models.CharField(max_length=64, blank=True, default="", db_index=True)

    def __str__(self) -> str:
        return f"device code {self.device_grant_id} for {self.resource}"


class AgentToken(models.Model):
    """The agent an access token was issued to (refreshed tokens inherit it)."""

    access_token = models.OneToOneField(
        "oauth2_provider.AccessToken", on_delete=models.CASCADE, related_name="harness"
    )
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="oauth_tokens")

    def __str__(self) -> str:
        return f"token for agent {self.agent_id}"
