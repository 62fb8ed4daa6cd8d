import json
import sys
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatcher.policy import profiles


class Command(BaseCommand):
    help = (
        "Replace a user's mode and rules with a JSON file ('-' reads standard input): "
        '{"mode": "standard", "allow": [...], "ask": [...], "deny": [...]}, each entry a '
        'rule or, in ask, {"rule": ..., "approvals": N, "group"?: ...}. Validated, saved as '
        "a new profile version and audited, exactly as the dashboard saves it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("file")

    def handle(self, *args: Any, username: str, file: str, **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named '{username}'.")
        try:
            text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
            document = json.loads(text)
        except OSError as error:
            raise CommandError(f"Cannot read {file}: {error.strerror or error}.") from None
        except (ValueError, RecursionError) as error:
            raise CommandError(f"{file} is not valid JSON: {error}.") from None
        before = profiles.rules_document(user)
        try:
            profile = profiles.set_rules(user=user, document=document, actor="cli")
        except profiles.InvalidProfile as invalid:
            lines = "\n".join(f"  - {problem}" for problem in invalid.problems)
            raise CommandError(f"Nothing was saved; fix these and run again:\n{lines}") from None
        if profiles.rules_document(user) == before:
            self.stdout.write(f"{username}'s rules are unchanged (profile v{profile.version}).")
        else:
            self.stdout.write(f"Saved {username}'s rules as profile v{profile.version}.")
