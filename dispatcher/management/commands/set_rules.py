import json
import sys
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatcher.policy import managed, profiles
from floor.errors import ServiceError
from teams.models import Team


class Command(BaseCommand):
    help = (
        "Replace one layer of policy with a JSON file ('-' reads standard input): a user's "
        "profile (set_rules USER FILE: "
        '{"mode": "standard", "allow": [...], "ask": [...], "deny": [...]}), the '
        "organization's (set_rules --org FILE --reason R) or a team's (set_rules --team "
        'TEAM FILE): {"max_mode"?, "allow", "ask", "deny"}. Each entry a rule, in ask '
        '{"rule": ..., "approvals": N, "group"?: ...}, in any list '
        '{"rule": ..., "log_only": true}. Validated, saved as a new version and audited, '
        "exactly as the dashboard saves it; with HARNESS_POLICY_TWO_PERSON=true an "
        "organization's change waits as a proposal (accept_policy_proposal)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs="+", metavar="[USER] FILE")
        target = parser.add_mutually_exclusive_group()
        target.add_argument("--org", action="store_true", help="the organization's layer")
        target.add_argument("--team", metavar="TEAM", help="a team's layer")
        parser.add_argument("--reason", default="", help="why (required for --org)")
        parser.add_argument(
            "--by",
            metavar="USERNAME",
            default="",
            help="the person making the change (required with HARNESS_POLICY_TWO_PERSON)",
        )

    def handle(self, *args: str, **options: Any) -> None:
        layered = options["org"] or options["team"]
        if len(args) != (1 if layered else 2):
            usage = "set_rules --org FILE | set_rules --team TEAM FILE | set_rules USER FILE"
            raise CommandError(f"Usage: {usage}.")
        document = _read(args[-1])
        if layered:
            return self._layer(document, **options)
        username = args[0]
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named '{username}'.")
        before = profiles.rules_document(user)
        try:
            profile = profiles.set_rules(user=user, document=document, actor=_actor(options))
        except profiles.InvalidProfile as invalid:
            raise _nothing_saved(invalid) from None
        if profiles.rules_document(user) == before:
            self.stdout.write(f"{username}'s rules are unchanged (profile v{profile.version}).")
        else:
            self.stdout.write(f"Saved {username}'s rules as profile v{profile.version}.")

    def _layer(self, document: Any, **options: Any) -> None:
        team = None
        if options["team"]:
            team = Team.objects.filter(name=options["team"]).first()
            if team is None:
                raise CommandError(f"No team named '{options['team']}'.")
        name = managed.layer_name(team)
        try:
            outcome = managed.set_layer(
                team=team, document=document, actor=_actor(options), reason=options["reason"]
            )
        except profiles.InvalidProfile as invalid:
            raise _nothing_saved(invalid) from None
        except ServiceError as refused:
            raise CommandError(str(refused)) from None
        if outcome.proposal is not None:
            self.stdout.write(
                f"Proposed a change to {name} (proposal {outcome.proposal.pk}); it applies "
                f"when another org admin accepts it: manage.py accept_policy_proposal "
                f"{outcome.proposal.pk} --by USERNAME."
            )
        elif not outcome.changed:
            self.stdout.write(f"{name.capitalize()} is unchanged (v{managed.layer_version(team)}).")
        else:
            assert outcome.layer is not None
            self.stdout.write(f"Saved {name} as v{outcome.layer.version}.")


def _read(file: str) -> Any:
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
        return json.loads(text)
    except OSError as error:
        raise CommandError(f"Cannot read {file}: {error.strerror or error}.") from None
    except (ValueError, RecursionError) as error:
        raise CommandError(f"{file} is not valid JSON: {error}.") from None


def _actor(options: dict[str, Any]) -> Any:
    """The person named by --by (their own name on the change), else "cli"."""
    if not options.get("by"):
        return "cli"
    user = get_user_model().objects.filter(username=options["by"], is_active=True).first()
    if user is None:
        raise CommandError(f"No active user named '{options['by']}'.")
    return user


def _nothing_saved(invalid: profiles.InvalidProfile) -> CommandError:
    lines = "\n".join(f"  - {problem}" for problem in invalid.problems)
    return CommandError(f"Nothing was saved; fix these and run again:\n{lines}")
