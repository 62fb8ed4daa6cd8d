from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from teams.services import add_member

from . import _members


class Command(BaseCommand):
    help = "Give a user a role (reviewer, auditor or admin) in a team."

    def add_arguments(self, parser: CommandParser) -> None:
        _members.add_arguments(parser)

    def handle(self, *args: Any, team: str, user: str, role: str, **options: Any) -> None:
        found, person = _members.team_and_user(team, user)
        if add_member(team=found, user=person, role=role, actor="cli"):
            self.stdout.write(f"{user} is now {role} of team '{found.name}'.")
        else:
            self.stdout.write(f"{user} was already {role} of team '{found.name}'.")
