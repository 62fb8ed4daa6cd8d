from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from teams.services import TeamError, create_team


class Command(BaseCommand):
    help = "Create a team. Then add members (add_member) and agents (create_agent --team)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        try:
            team = create_team(name=name, actor="cli")
        except TeamError as error:
            raise CommandError(str(error)) from None
        self.stdout.write(f"Created team '{team.name}'.")
