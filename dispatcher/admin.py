"""The admin shows everything and changes nothing: every change has one write path, a
service with its audit event (the create_agent / revoke_agent / set_mode commands,
/permissions/, the agent API, the approvals dashboard)."""

from django.contrib import admin

from dispatcher.models import Agent, AgentSession, ToolCall
from harness_site.admin import ReadOnlyAdmin


@admin.register(Agent)
class AgentAdmin(ReadOnlyAdmin):
    list_display = ["name", "owner", "token_prefix", "workspace", "is_active", "created_at"]
    list_filter = ["is_active"]


@admin.register(AgentSession)
class AgentSessionAdmin(ReadOnlyAdmin):
    list_display = ["id", "agent", "title", "mode", "created_at"]


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyAdmin):
    list_display = ["name", "status", "decided_by", "session", "created_at"]
    list_filter = ["status", "name"]
