from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatcher import agents
from floor.errors import ServiceError
from teams.models import Team
from teams.services import TeamError, team_named


def _user(username: str) -> User:
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(
            f"No user named '{username}'. Create it first (manage.py createsuperuser)."
        )
    return user


class Command(BaseCommand):
    help = (
        "Create an agent owned by a user, working for a team. Prints its token once, "
        "alone on the last line."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--owner", required=True, help="Username of the owning user.")
        parser.add_argument(
            "--team",
            default="",
            help="The team it works for (required once there is more than one team).",
        )
        parser.add_argument(
            "--sponsor", default="", help="Username of the person accountable if the owner leaves."
        )
        parser.add_argument(
            "--workspace", default="", help="Fixed workspace directory for every session."
        )

    def handle(
        self,
        *args: Any,
        name: str,
        owner: str,
        team: str,
        sponsor: str,
        workspace: str,
        **options: Any,
    ) -> None:
        user = _user(owner)
        if team:
            try:
                found = team_named(team)
            except TeamError as error:
                raise CommandError(str(error)) from None
        elif Team.objects.filter(is_default=False).exists():
            names = ", ".join(Team.objects.values_list("name", flat=True))
            raise CommandError(f"Name the agent's team with --team. Teams: {names}.")
        else:
            found = Team.objects.default()
        try:
            agent, token = agents.create_agent(
                owner=user,
                name=name,
                workspace=workspace,
                actor="cli",
                team=found,
                sponsor=_user(sponsor) if sponsor else None,
            )
        except ServiceError as refused:
            raise CommandError(str(refused)) from None
        self.stdout.write(
            f"Created agent '{agent.name}' (prefix {agent.token_prefix}) owned by {owner}, "
            f"team '{found.name}'."
        )
        self.stdout.write(f"Workspace: {agent.workspace or 'a fresh directory per session'}")
        self.stdout.write("The token is shown once; store it now:")
        self.stdout.write(token)
