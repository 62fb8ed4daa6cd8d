"""manage.py audit_checkpoint [--output FILE] [--url URL] [--all] [--session ID]"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from audit import checkpoints, signing
from floor import outbound


class Command(BaseCommand):
    help = (
        "Append the signed head of every chain that changed since the file's last "
        "checkpoint (one JSON line per chain) to a file outside the database; "
        "`verify_audit --against FILE` checks the log against it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--output",
            type=Path,
            default=Path(settings.HARNESS_CHECKPOINT_PATH),
            help="The checkpoint file to append to (default: HARNESS_CHECKPOINT_PATH).",
        )
        parser.add_argument(
            "--url",
            default=settings.HARNESS_CHECKPOINT_URL,
            help="Also POST the lines to this URL (default: HARNESS_CHECKPOINT_URL).",
        )
        parser.add_argument(
            "--all", action="store_true", help="Every chain, not only those that changed."
        )
        parser.add_argument("--session", help="Only this session's chain (or 'global').")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            run = checkpoints.write(
                options["output"],
                all_chains=options["all"],
                url=options["url"],
                chain=options["session"],
            )
        except signing.AuditKeyError as error:
            raise CommandError(f"Cannot read the audit key: {error}") from error
        except (OSError, ValueError, outbound.OutboundRefused) as error:
            raise CommandError(f"Could not write the checkpoint: {error}") from error
        for refusal in run.refused:
            self.stderr.write(f"NOT SIGNED {refusal}")
        if run.refused:
            raise CommandError(
                f"{len(run.refused)} heads do not verify and were not checkpointed (listed "
                f"above); {len(run.written)} were. Run verify_audit to see what changed."
            )
        self.stdout.write(
            self.style.SUCCESS(f"{len(run.written)} chain heads appended to {options['output']}.")
        )
