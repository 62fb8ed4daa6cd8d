from django.contrib import admin

from harness_site.admin import ReadOnlyAdmin

from .models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    """Read-only: the log is append-only."""

    list_display = ["id", "chain", "seq", "kind", "actor", "subject", "created_at"]
    list_filter = ["kind"]
