import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatcher.policy import profiles


class Command(BaseCommand):
    help = (
        "Print a user's mode and rules as JSON: "
        '{"mode", "allow", "ask", "deny"} (the format set_rules reads).'
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")

    def handle(self, *args: Any, username: str, **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named '{username}'.")
        document = profiles.rules_document(user)
        self.stdout.write(json.dumps(document, indent=2, ensure_ascii=False))
