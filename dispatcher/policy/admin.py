"""Profiles are shown, never changed here: edit modes and rules at /permissions/."""

from django.contrib import admin

from dispatcher.policy.models import PermissionProfile
from harness_site.admin import ReadOnlyAdmin


@admin.register(PermissionProfile)
class PermissionProfileAdmin(ReadOnlyAdmin):
    """Edit modes and rules at /permissions/ (versioned and audited)."""

    list_display = ["user", "mode", "version", "updated_at"]
