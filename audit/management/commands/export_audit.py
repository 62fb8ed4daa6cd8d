"""manage.py export_audit [--format jsonl|csv] [--session ID] [--output FILE] [filters]"""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper

from audit import export
from audit.models import AuditEvent


def _day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError as error:
        raise CommandError(f"'{text}' is not a date; use YYYY-MM-DD.") from error


class Progress:
    """A one-line progress bar on stderr, redrawn every `step` rows."""

    def __init__(self, out: Any, total: int, step: int = 1000, width: int = 30) -> None:
        self.out, self.total, self.step, self.width, self.done = out, total, step, width, 0

    def advance(self, events: int) -> None:
        before = self.done // self.step
        self.done += events
        if self.done // self.step != before or self.done == self.total:
            self.draw()

    def draw(self) -> None:
        share = self.done / self.total if self.total else 1.0
        filled = int(share * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        self.out.write(
            f"\rExporting [{bar}] {share:4.0%} {self.done}/{self.total} events", ending=""
        )
        self.out.flush()

    def finish(self) -> None:
        self.draw()
        self.out.write("")


class Command(BaseCommand):
    help = "Export audit events as JSON Lines (verifiable with verify_audit --file) or CSV."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--format", choices=sorted(export.FORMATS), default="jsonl")
        parser.add_argument("--session", help="Only this session's chain (or 'global').")
        parser.add_argument("--kind", help="Only events of this kind, e.g. call.denied.")
        parser.add_argument("--since", type=_day, help="Events on or after this day (UTC).")
        parser.add_argument("--until", type=_day, help="Events before this day (UTC).")
        parser.add_argument("--output", default="-", help="File to write; '-' is stdout.")
        parser.add_argument("--no-progress", action="store_true", help="No progress bar.")

    def handle(self, *args: Any, **options: Any) -> None:
        events = AuditEvent.objects.all()
        if options["session"]:
            events = events.filter(chain=options["session"])
        if options["kind"]:
            events = events.filter(kind=options["kind"])
        for name, lookup in (("since", "created_at__gte"), ("until", "created_at__lt")):
            if options[name]:
                moment = datetime.combine(options[name], time.min, tzinfo=UTC)
                events = events.filter(**{lookup: moment})
        progress = None
        if not options["no_progress"]:
            progress = Progress(self.stderr, events.count())
        if options["output"] == "-":
            self._write(self.stdout, events, options["format"], progress)
        else:
            with open(options["output"], "wb") as out:
                self._write(out, events, options["format"], progress)
        if progress:
            progress.finish()

    def _write(self, out: Any, events: Any, fmt: str, progress: Progress | None) -> None:
        for chunk in export.export_chunks(events, fmt):
            if isinstance(out, OutputWrapper):
                out.write(chunk.data.decode(), ending="")
            else:
                out.write(chunk.data)
            if progress and chunk.events:
                progress.advance(chunk.events)
