from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatcher import agents


class Command(BaseCommand):
    help = "Create an agent owned by a user. Prints its token once, alone on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--owner", required=True, help="Username of the owning user.")
        parser.add_argument(
            "--workspace", default="", help="Fixed workspace directory for every session."
        )

    def handle(self, *args: Any, name: str, owner: str, workspace: str, **options: Any) -> None:
        user = get_user_model().objects.filter(username=owner).first()
        if user is None:
            raise CommandError(
                f"No user named '{owner}'. Create it first (manage.py createsuperuser)."
            )
        agent, token = agents.create_agent(owner=user, name=name, workspace=workspace, actor="cli")
        self.stdout.write(
            f"Created agent '{agent.name}' (prefix {agent.token_prefix}) owned by {owner}."
        )
        self.stdout.write(f"Workspace: {agent.workspace or 'a fresh directory per session'}")
        self.stdout.write("The token is shown once; store it now:")
        self.stdout.write(token)
