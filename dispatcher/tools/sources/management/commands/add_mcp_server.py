import shlex
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatcher.tools.sources import services
from dispatcher.tools.sources.management.report import write_report
from floor.errors import ServiceError
from teams.services import TeamError, team_named


class Command(BaseCommand):
    help = (
        "Register an upstream MCP server: its tools appear as NAME__tool, each definition "
        "pinned by its fingerprint."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="Letters, digits, single '-' or '_' (NAME__tool).")
        where = parser.add_mutually_exclusive_group(required=True)
        where.add_argument("--command", help='A stdio server: "CMD ARGS..." (shell words).')
        where.add_argument("--url", help="A streamable HTTP server's endpoint.")
        parser.add_argument("--env", action="append", default=[], metavar="K=V")
        parser.add_argument("--header", action="append", default=[], metavar="K=V")
        parser.add_argument(
            "--path",
            action="append",
            default=[],
            metavar="PATH[:ro]",
            help="An absolute path the sandboxed stdio server may use: read-write, or "
            "read-only with :ro. Nothing else of the host's files is there.",
        )
        parser.add_argument(
            "--trust-annotations",
            action="store_true",
            help="Let its readOnlyHint / openWorldHint relax what modes allow.",
        )
        parser.add_argument("--timeout", type=float, default=60.0, help="Seconds per call.")
        parser.add_argument("--actor", default="cli", help="Who is registering it (audit).")
        parser.add_argument(
            "--team",
            default="",
            help="The team whose agents its tools serve (default: every team's agents).",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            command = shlex.split(opts["command"]) if opts["command"] else None
            team = team_named(opts["team"]) if opts["team"] else None
            server, report = services.add_server(
                name=opts["name"],
                actor=f"cli:{opts['actor']}",
                command=command,
                url=opts["url"] or "",
                env=services.parse_pairs(opts["env"], "--env"),
                headers=services.parse_pairs(opts["header"], "--header"),
                paths=opts["path"],
                trust_annotations=opts["trust_annotations"],
                timeout=opts["timeout"],
                team=team,
            )
        except (ServiceError, TeamError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"Registered MCP server '{server.name}' ({server.transport}).")
        write_report(self.stdout, report)
