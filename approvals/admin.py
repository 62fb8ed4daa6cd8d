"""Read-only: decisions are taken in the dashboard, where the reviewer sees the arguments
the decision binds to (their digest)."""

from django.contrib import admin

from harness_site.admin import ReadOnlyAdmin

from .models import ApprovalRequest


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    list_display = ["call", "reason", "created_at", "expires_at", "decision", "decided_by"]
    list_filter = ["decision"]
