"""What add_member and remove_member share: TEAM USER --role, read into real objects."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.management.base import CommandError, CommandParser

from teams.models import Team, TeamRole
from teams.services import TeamError, team_named


def add_arguments(parser: CommandParser) -> None:
    parser.add_argument("team")
    parser.add_argument("user")
    parser.add_argument("--role", required=True, choices=TeamRole.values)


def team_and_user(team: str, user: str) -> tuple[Team, User]:
    try:
        found = team_named(team)
    except TeamError as error:
        raise CommandError(str(error)) from None
    person = get_user_model().objects.filter(username=user).first()
    if person is None:
        raise CommandError(f"No user named '{user}'.")
    return found, person
