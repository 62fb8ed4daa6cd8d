from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatcher import agents
from dispatcher.models import Agent


class Command(BaseCommand):
    help = "Revoke an agent's token (by token prefix). Its next request is refused."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("prefix")

    def handle(self, *args: Any, prefix: str, **options: Any) -> None:
        agent = Agent.objects.filter(token_prefix=prefix).first()
        if agent is None:
            raise CommandError(f"No agent with token prefix '{prefix}'.")
        agents.revoke_agent(agent=agent, actor="cli")
        self.stdout.write(f"Revoked agent '{agent.name}' ({prefix}).")
