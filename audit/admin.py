from django.contrib import admin
from django.contrib.auth.models import Group, User

from harness_site.admin import ReadOnlyAdmin

from .models import AuditEvent, CheckpointRun


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    """Read-only: the log is append-only."""

    list_display = ["id", "chain", "seq", "kind", "actor", "subject", "created_at"]
    list_filter = ["kind"]


@admin.register(CheckpointRun)
class CheckpointRunAdmin(ReadOnlyAdmin):
    """Read-only: each checkpoint run replaces its file's row (audit.checkpoints.write)."""

    list_display = ["path", "finished_at", "succeeded", "written", "refused", "error"]


# Users and their roles, read-only: roles change through audit.roles, with their events.
# (auth's admin registered these first: its app comes before this one.)
for _model in (User, Group):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)


@admin.register(User)
class UserAdmin(ReadOnlyAdmin):
    list_display = ["username", "is_active", "is_superuser", "last_login"]
    list_filter = ["is_active", "groups"]


@admin.register(Group)
class GroupAdmin(ReadOnlyAdmin):
    list_display = ["name"]
