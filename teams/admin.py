from django.contrib import admin

from harness_site.admin import ReadOnlyAdmin

from .models import Membership, Team


# Read-only: teams and members change through teams.services, with their events.
@admin.register(Team)
class TeamAdmin(ReadOnlyAdmin):
    list_display = ["name", "is_default", "created_at"]


@admin.register(Membership)
class MembershipAdmin(ReadOnlyAdmin):
    list_display = ["team", "user", "role", "source", "created_at"]
    list_filter = ["team", "role", "source"]
