"""A reviewer's request: one per call that asked, and the decision that closed it."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from dispatcher.models import Status, ToolCall


class Decision(models.TextChoices):
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class ApprovalRequestQuerySet(models.QuerySet["ApprovalRequest"]):
    def pending(self) -> ApprovalRequestQuerySet:
        return self.filter(call__status=Status.PENDING_APPROVAL)

    def due(self, now: object) -> ApprovalRequestQuerySet:
        return self.pending().filter(expires_at__lt=now)


class ApprovalRequest(models.Model):
    call = models.OneToOneField(ToolCall, on_delete=models.PROTECT, related_name="approval")
    reason = models.TextField(help_text="Why the call asks: the mode or rule that said ask.")
    asked_by = models.CharField(max_length=200)
    presentation = models.JSONField(default=dict, help_text="The tool's present_call output.")
    digest = models.CharField(max_length=64, help_text="Digest of the logged arguments.")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()

    decision = models.CharField(max_length=16, choices=Decision.choices, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    feedback = models.TextField(blank=True)
    digest_seen = models.CharField(max_length=64, blank=True)

    objects = ApprovalRequestQuerySet.as_manager()

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"approval for {self.call}"
