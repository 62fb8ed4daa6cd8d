from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from demo import agent as demo_agent


class Command(BaseCommand):
    help = "Run the scripted demo agent (no LLM) against a Harness server, printing each result."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="Harness base URL.")
        parser.add_argument("--token", required=True, help="An agent token (create_agent).")
        parser.add_argument(
            "--auto-approve-as",
            metavar="USER",
            default=None,
            help="Approve pending calls in-process as this reviewer instead of waiting for "
            "the browser (needs this process to share the server's database).",
        )

    def handle(
        self, *args: Any, url: str, token: str, auto_approve_as: str | None, **options: Any
    ) -> None:
        if not demo_agent.run(url, token, out=self.stdout, auto_approve_as=auto_approve_as):
            raise CommandError("Some demo scenarios did not end as expected.")
