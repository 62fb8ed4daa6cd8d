from django.apps import AppConfig


class SourcesConfig(AppConfig):
    """Upstream MCP servers as tool sources, their pinned tools, and the /tools/ pages."""

    name = "dispatcher.tools.sources"
    label = "sources"
    verbose_name = "Tool sources"
    default_auto_field = "django.db.models.BigAutoField"
