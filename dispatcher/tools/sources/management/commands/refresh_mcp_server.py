from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatcher.tools.sources import services
from dispatcher.tools.sources.management.report import write_report
from floor.errors import ServiceError


class Command(BaseCommand):
    help = (
        "List a server's tools again: a changed or new definition is held until an admin "
        "accepts it on the Tools page; a tool gone upstream is reported missing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--actor", default="cli")

    def handle(self, *args: Any, name: str, actor: str, **opts: Any) -> None:
        try:
            report = services.refresh_server(name=name, actor=f"cli:{actor}")
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"Refreshed MCP server '{name}'.")
        write_report(self.stdout, report)
