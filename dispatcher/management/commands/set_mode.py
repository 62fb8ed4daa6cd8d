from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatcher.policy import profiles
from dispatcher.policy.models import Mode


class Command(BaseCommand):
    help = "Set a user's permission mode (read_only, standard, trusted, locked)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("mode", choices=Mode.values)

    def handle(self, *args: Any, username: str, mode: str, **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named '{username}'.")
        profile = profiles.set_mode(user=user, mode=mode, actor="cli")
        self.stdout.write(f"{username} is now in {profile.mode} mode (profile v{profile.version}).")
