import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatcher.policy import managed, profiles
from teams.models import Team


class Command(BaseCommand):
    help = (
        "Print one layer of policy as JSON, the format set_rules reads: a user's "
        '(get_rules USER: {"mode", "allow", "ask", "deny"}), the organization\'s '
        '(get_rules --org) or a team\'s (get_rules --team TEAM): {"max_mode", "allow", '
        '"ask", "deny"}.'
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", nargs="?")
        target = parser.add_mutually_exclusive_group()
        target.add_argument("--org", action="store_true", help="the organization's layer")
        target.add_argument("--team", metavar="TEAM", help="a team's layer")

    def handle(self, *args: Any, username: str | None, **options: Any) -> None:
        if options["org"] or options["team"]:
            if username:
                raise CommandError("Name a user, or --org, or --team TEAM: not both.")
            team = None
            if options["team"]:
                team = Team.objects.filter(name=options["team"]).first()
                if team is None:
                    raise CommandError(f"No team named '{options['team']}'.")
            document = managed.layer_document(team)
        else:
            if not username:
                raise CommandError(
                    "Usage: get_rules USER | get_rules --org | get_rules --team TEAM."
                )
            user = get_user_model().objects.filter(username=username).first()
            if user is None:
                raise CommandError(f"No user named '{username}'.")
            document = profiles.rules_document(user)
        self.stdout.write(json.dumps(document, indent=2, ensure_ascii=False))
