from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from teams.services import remove_member

from . import _members


class Command(BaseCommand):
    help = "Take a team role from a user (their open pages are closed and checked again)."

    def add_arguments(self, parser: CommandParser) -> None:
        _members.add_arguments(parser)

    def handle(self, *args: Any, team: str, user: str, role: str, **options: Any) -> None:
        found, person = _members.team_and_user(team, user)
        if remove_member(team=found, user=person, role=role, actor="cli"):
            self.stdout.write(f"{user} is no longer {role} of team '{found.name}'.")
        else:
            self.stdout.write(f"{user} was not {role} of team '{found.name}'.")
