from typing import Any

from django.core.management.base import BaseCommand

from dispatcher.tools.sources.models import McpServer


class Command(BaseCommand):
    help = "List the registered MCP servers and the state of each of their tools."

    def handle(self, *args: Any, **opts: Any) -> None:
        servers = McpServer.objects.prefetch_related("tools")
        if not servers:
            self.stdout.write("No MCP servers are registered (add one with add_mcp_server).")
        for server in servers:
            trust = "annotations trusted" if server.trust_annotations else "annotations untrusted"
            env = ", ".join(sorted(server.env)) or "-"
            self.stdout.write(
                f"{server.name}  v{server.version}  {server.transport}: {server.target()}  "
                f"({trust}; timeout {server.timeout:g} s; env: {env})"
            )
            for tool in server.tools.all():
                note = f"  -- {tool.problem}" if tool.problem else ""
                self.stdout.write(f"  {tool.state:<9} {tool.exposed_name}{note}")
