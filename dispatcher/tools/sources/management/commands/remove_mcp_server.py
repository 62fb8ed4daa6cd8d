from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatcher.tools.sources import services
from floor.errors import ServiceError


class Command(BaseCommand):
    help = "Unregister an MCP server: its tools are no longer offered, their calls rejected."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--actor", default="cli")

    def handle(self, *args: Any, name: str, actor: str, **opts: Any) -> None:
        try:
            services.remove_server(name=name, actor=f"cli:{actor}")
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"Removed MCP server '{name}'.")
