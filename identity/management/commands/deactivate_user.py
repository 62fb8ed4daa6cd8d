"""manage.py deactivate_user USERNAME [--sponsor USERNAME] [--actor TEXT]"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit import roles


class Command(BaseCommand):
    help = (
        "Deactivate a person: their sockets close, their votes on pending calls and their "
        "unused one-tap links are void, their agents are revoked (or, with --sponsor, "
        "handed to the sponsor); one transaction, audited."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--sponsor", help="Hand their agents to this active person.")
        parser.add_argument(
            "--actor", default="manage.py deactivate_user", help="Who, for the audit log."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        user = User.objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user '{options['username']}'.")
        sponsor = None
        if options["sponsor"]:
            sponsor = User.objects.filter(username=options["sponsor"], is_active=True).first()
            if sponsor is None:
                raise CommandError(f"No active user '{options['sponsor']}' to hand agents to.")
            if sponsor.pk == user.pk:
                raise CommandError("A person cannot sponsor their own agents.")
        if not roles.deactivate(user=user, actor=options["actor"], sponsor=sponsor):
            self.stdout.write(f"{user.username} was inactive already: nothing changed.")
            return
        self.stdout.write(f"{user.username} deactivated.")
