"""manage.py verify_audit [--session ID] [--file export.jsonl] [--against checkpoints.jsonl]"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from approvals import stepup
from audit import checkpoints, signing
from audit.verify import Report, verify_database, verify_file

UNHEADED = (
    "The file carries no chain heads: events cut from the end of a chain, or whole "
    "chains left out, are not detected. Verify it --against a checkpoint file to know "
    "it is whole."
)


class Command(BaseCommand):
    help = (
        "Recompute the audit hash chains (database or a JSON Lines export), check each "
        "chain head's signature and, with --against, every checkpoint in a checkpoint "
        "file; name the first bad event of each chain. Exits non-zero if any chain fails."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--session", help="Verify only this session's chain (or 'global').")
        parser.add_argument("--file", type=Path, help="Verify a JSON Lines export instead.")
        parser.add_argument(
            "--against",
            type=Path,
            help="A checkpoint file (manage.py audit_checkpoint): every checkpointed head "
            "must still be in the log.",
        )
        parser.add_argument(
            "--heads", action="store_true", help="Print each chain's head (seq and hash)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        chain = options["session"]
        try:
            report = self._verify(options["file"], options["against"], chain)
        except signing.AuditKeyError as error:
            raise CommandError(f"Cannot read the audit key: {error}") from error
        except (OSError, ValueError) as error:
            raise CommandError(str(error)) from error
        if report.wrong_key:
            raise CommandError(signing.wrong_key_message(report.wrong_key))
        if chain and report.events == 0 and not report.problems:
            raise CommandError(f"No audit events for '{chain}'. Check the session id.")
        if options["heads"]:
            for name, head in sorted(report.heads.items()):
                self.stdout.write(f"{name} seq={head.seq} hash={head.hash}")
        for problem in report.problems:
            self.stderr.write(f"BAD {problem}")
        # The signed votes (step-up) in the database, beside their events' copies.
        kept = [] if options["file"] else stepup.kept_problems()
        for line in kept:
            self.stderr.write(f"BAD {line}")
        if kept and report.ok:
            raise CommandError(f"{len(kept)} signed votes do not verify (listed above).")
        if not report.ok:
            raise CommandError(
                f"{len(report.problems) + len(kept)} problems in {report.chains} chains "
                f"({report.events} events, {report.checkpoints} checkpoints read). The first "
                "bad event of each chain is listed above."
            )
        against = f", {report.checkpoints} checkpoints matched" if options["against"] else ""
        signed = f", {report.assertions} passkey signatures" if report.assertions else ""
        self.stdout.write(
            self.style.SUCCESS(
                f"OK: {report.chains} chains, {report.events} events verified{against}{signed}."
            )
        )
        if options["file"] and not options["against"]:
            # An export carries no heads: "OK" says nothing of what is not in the file.
            self.stdout.write(UNHEADED)

    def _verify(self, file: Path | None, against: Path | None, chain: str | None) -> Report:
        marks = list(checkpoints.read(against)) if against else []
        if file:
            return verify_file(file, chain, marks)
        return verify_database(chain, marks)
