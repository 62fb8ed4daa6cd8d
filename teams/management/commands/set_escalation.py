from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from teams.services import TeamError, escalation_text, set_escalation, team_named


class Command(BaseCommand):
    help = (
        "Offer a team's undecided asks to the next tier after a delay: another team "
        "(--to TEAM) or the organization's reviewers. --off turns it off."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("team")
        when = parser.add_mutually_exclusive_group(required=True)
        when.add_argument("--after", type=int, metavar="SECONDS")
        when.add_argument("--off", action="store_true")
        parser.add_argument("--to", default="", metavar="TEAM")

    def handle(
        self, *args: Any, team: str, after: int | None, off: bool, to: str, **options: Any
    ) -> None:
        try:
            subject = team_named(team)
            target = team_named(to) if to else None
            if off and target is not None:
                raise TeamError("--to names where asks escalate; with --off nothing escalates.")
            changed = set_escalation(
                team=subject, after=None if off else after, to=target, actor="cli"
            )
        except TeamError as error:
            raise CommandError(str(error)) from None
        self.stdout.write(("" if changed else "Unchanged. ") + escalation_text(subject))
        timeout = settings.HARNESS_APPROVAL_TIMEOUT
        if not off and after is not None and after >= timeout:
            self.stderr.write(
                f"Note: asks expire after {timeout} s (HARNESS_APPROVAL_TIMEOUT), before this "
                "delay: none will escalate."
            )
