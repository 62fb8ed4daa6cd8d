"""Channels (configured by admins), their deliveries, and reviewers' push subscriptions.

Part of the approvals app (imported by approvals.models). Every change is in
`approvals.notifications.services`.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models


class Kind(models.TextChoices):
    WEBHOOK = "webhook", "Webhook"
    SLACK = "slack", "Slack"
    EMAIL = "email", "Email"
    WEBPUSH = "webpush", "Web Push"


class Channel(models.Model):
    """Where asks are sent, and which asks (by agent, tool or rule) to whom.

    Empty match lists match every ask; no users and no groups means every reviewer.
    `config` by kind: webhook {"url", "secret"}; slack {"webhook_url"} or {"bot_token",
    "channel", "api_url"?}; email {"addresses"?: [...]}; webpush {} (each reviewer's own
    subscriptions).
    """

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    enabled = models.BooleanField(default=True)
    config = models.JSONField(default=dict, blank=True)
    match_agents = models.JSONField(default=list, blank=True)
    match_tools = models.JSONField(default=list, blank=True)
    match_rules = models.JSONField(default=list, blank=True)
    users = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="+")
    groups = models.ManyToManyField(Group, blank=True, related_name="+")
    # "dashboard", or the environment variable that created it (kept in step with it).
    source = models.CharField(max_length=40, default="dashboard")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class Delivery(models.Model):
    """One message to one channel (and, for email and push, one recipient) about one ask."""

    class Event(models.TextChoices):
        ASKED = "asked"
        DECIDED = "decided"
        # No one decided within the team's escalation delay: the next tier is told.
        ESCALATED = "escalated"

    class State(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        FAILED = "failed"  # retried with backoff until the attempts run out
        GAVE_UP = "gave_up"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="deliveries")
    approval = models.ForeignKey(
        "approvals.ApprovalRequest", on_delete=models.CASCADE, related_name="deliveries"
    )
    event = models.CharField(max_length=16, choices=Event.choices, default=Event.ASKED)
    recipient = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    subscription = models.ForeignKey(
        "approvals.PushSubscription", null=True, blank=True, on_delete=models.CASCADE
    )
    address = models.CharField(max_length=254, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    # Slack with a bot token: {"channel", "ts"} of the message, to update it in place.
    external = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["approval", "event"])]

    def __str__(self) -> str:
        return f"{self.channel.name} {self.event} {self.state}"


class PushSubscription(models.Model):
    """A reviewer's browser, subscribed to Web Push from the dashboard."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="push_subscriptions"
    )
    endpoint = models.URLField(max_length=1000)
    keys = models.JSONField(default=dict)  # {"p256dh", "auth"} from the browser
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # Keyed by person and endpoint: registering someone else's endpoint makes a row of
        # one's own, never moves theirs (issue 31).
        constraints = [
            models.UniqueConstraint(fields=["user", "endpoint"], name="push_user_endpoint")
        ]

    def __str__(self) -> str:
        return f"push for {self.user}"
