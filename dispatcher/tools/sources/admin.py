"""Tool sources are shown, never changed here: register and review them at /tools/."""

from django.contrib import admin

from dispatcher.tools.sources.models import McpServer, McpTool, ServerVersion
from harness_site.admin import ReadOnlyAdmin


@admin.register(McpServer)
class McpServerAdmin(ReadOnlyAdmin):
    """Change servers at /tools/ or with the *_mcp_server commands (versioned, audited)."""

    list_display = ["name", "transport", "version", "trust_annotations", "timeout", "updated_at"]
    # Secret values (variables, headers) are not shown.
    exclude = ["env", "headers"]


@admin.register(McpTool)
class McpToolAdmin(ReadOnlyAdmin):
    list_display = ["exposed_name", "state", "fingerprint", "accepted_by", "accepted_at"]
    list_filter = ["state"]


@admin.register(ServerVersion)
class ServerVersionAdmin(ReadOnlyAdmin):
    list_display = ["server_name", "version", "change", "actor", "created_at"]
