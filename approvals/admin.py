"""Read-only: decisions are taken in the dashboard, where the reviewer sees the arguments
the decision binds to (their digest)."""

from django.contrib import admin

from harness_site.admin import ReadOnlyAdmin

from .models import ApprovalRequest, Channel, Delivery, PushSubscription, UsedLink, Vote


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    list_display = ["call", "reason", "created_at", "expires_at", "decision", "decided_by"]
    list_filter = ["decision"]


@admin.register(Vote)
class VoteAdmin(ReadOnlyAdmin):
    list_display = ["approval", "voter", "verdict", "via", "created_at"]


@admin.register(UsedLink)
class UsedLinkAdmin(ReadOnlyAdmin):
    list_display = ["nonce", "approval", "recipient", "verdict", "used_at"]


@admin.register(Channel)
class ChannelAdmin(ReadOnlyAdmin):
    """Configured at /approvals/notifications/ (audited); the config holds secrets."""

    list_display = ["name", "kind", "enabled", "source", "created_at"]
    exclude = ["config"]


@admin.register(Delivery)
class DeliveryAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "channel", "event", "state", "attempts", "response_status"]
    list_filter = ["state", "event"]


@admin.register(PushSubscription)
class PushSubscriptionAdmin(ReadOnlyAdmin):
    list_display = ["user", "created_at"]
    exclude = ["keys"]
