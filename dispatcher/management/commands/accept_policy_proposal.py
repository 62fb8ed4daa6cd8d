from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatcher.policy import managed
from floor.errors import ServiceError


class Command(BaseCommand):
    help = (
        "Accept a proposed change to the organization's policy (HARNESS_POLICY_TWO_PERSON): "
        "applied as its next version, audited with both names. --by names the accepting "
        "org admin, who must not be the proposer. Without an id, lists pending proposals."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("proposal", nargs="?", type=int)
        parser.add_argument("--by", metavar="USERNAME", default="")

    def handle(self, *args: Any, proposal: int | None, by: str, **options: Any) -> None:
        if proposal is None:
            for row in managed.pending_proposals():
                who = row.proposed_by.get_username() if row.proposed_by else "?"
                self.stdout.write(
                    f"{row.pk}\tby {who}\ton v{row.base_version}\t{row.reason}\t{row.diff}"
                )
            return
        user = get_user_model().objects.filter(username=by, is_active=True).first()
        if user is None:
            raise CommandError("Name the accepting org admin: --by USERNAME.")
        try:
            layer = managed.accept_proposal(proposal_id=proposal, user=user)
        except ServiceError as refused:
            raise CommandError(str(refused)) from None
        self.stdout.write(
            f"Accepted proposal {proposal}: the organization's policy is now v{layer.version}."
        )
