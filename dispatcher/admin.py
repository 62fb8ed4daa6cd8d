from django.contrib import admin
from django.http import HttpRequest

from .models import Agent, AgentSession, PermissionProfile, ToolCall


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin[Agent]):
    list_display = ["name", "owner", "token_prefix", "workspace", "is_active", "created_at"]
    list_filter = ["is_active"]
    readonly_fields = ["token_prefix", "token_hash", "created_at", "revoked_at"]


@admin.register(PermissionProfile)
class PermissionProfileAdmin(admin.ModelAdmin[PermissionProfile]):
    list_display = ["user", "mode", "version", "updated_at"]


@admin.register(AgentSession)
class AgentSessionAdmin(admin.ModelAdmin[AgentSession]):
    list_display = ["id", "agent", "title", "mode", "created_at"]
    readonly_fields = ["agent", "title", "mode", "workspace", "created_at", "updated_at"]


@admin.register(ToolCall)
class ToolCallAdmin(admin.ModelAdmin[ToolCall]):
    """Read-only: calls change state only through the services."""

    list_display = ["name", "status", "decided_by", "session", "created_at"]
    list_filter = ["status", "name"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
