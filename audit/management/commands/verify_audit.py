"""manage.py verify_audit [--session ID] [--file export.jsonl]"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit.verify import verify_database, verify_file


class Command(BaseCommand):
    help = (
        "Recompute the audit hash chains (database or a JSON Lines export) and name the "
        "first bad event of each chain. Exits non-zero if any chain fails."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--session", help="Verify only this session's chain (or 'global').")
        parser.add_argument("--file", type=Path, help="Verify a JSON Lines export instead.")
        parser.add_argument(
            "--heads", action="store_true", help="Print each chain's head (seq and hash)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        chain = options["session"]
        if options["file"]:
            try:
                report = verify_file(options["file"], chain)
            except (OSError, ValueError) as error:
                raise CommandError(str(error)) from error
        else:
            report = verify_database(chain)
        if chain and report.events == 0 and not report.problems:
            raise CommandError(f"No audit events for '{chain}'. Check the session id.")
        if options["heads"]:
            for name, head in sorted(report.heads.items()):
                self.stdout.write(f"{name} seq={head.seq} hash={head.hash}")
        for problem in report.problems:
            self.stderr.write(f"BAD {problem}")
        if not report.ok:
            raise CommandError(
                f"{len(report.problems)} of {report.chains} chains failed verification "
                f"({report.events} events read). The first bad event of each is listed above."
            )
        self.stdout.write(
            self.style.SUCCESS(f"OK: {report.chains} chains, {report.events} events verified.")
        )
