"""Streaming exports of the log as JSON Lines or CSV, in constant memory.

Rows come from a database cursor in chunks (`QuerySet.iterator`), are written one at a
time and handed on as text chunks; nothing holds more than one chunk. JSON Lines carries
every field that is hashed plus prev_hash and hash, so `verify_audit --file` (or the
recipe in docs/audit.md) can check an export on another machine.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.db.models import QuerySet

from .models import AuditEvent
from .verify import EVENT_FIELDS

FORMATS = {
    "jsonl": ("application/x-ndjson; charset=utf-8", "jsonl"),
    "csv": ("text/csv; charset=utf-8", "csv"),
}
ROWS_PER_CHUNK = 500
CURSOR_CHUNK = 2000


def event_dicts(events: QuerySet[AuditEvent]) -> Iterator[dict[str, Any]]:
    """Each event as the export writes it, in chain and seq order."""
    rows = events.order_by("chain", "seq").values_list(*EVENT_FIELDS)
    for values in rows.iterator(chunk_size=CURSOR_CHUNK):
        event = dict(zip(EVENT_FIELDS, values, strict=True))
        event["created_at"] = event["created_at"].isoformat()
        if event["session_id"] is not None:
            event["session_id"] = str(event["session_id"])
        yield event


def jsonl_lines(events: QuerySet[AuditEvent]) -> Iterator[str]:
    for event in event_dicts(events):
        yield json.dumps(event, ensure_ascii=False) + "\n"


def csv_lines(events: QuerySet[AuditEvent]) -> Iterator[str]:
    """CSV with the payload as canonical JSON text. Every cell a spreadsheet could read as a
    formula starts with a fixed Harness value ("{", a uuid, "agent:", ...), never agent text."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def line(row: list[Any]) -> str:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow(row)
        return buffer.getvalue()

    yield line(list(EVENT_FIELDS))
    for event in event_dicts(events):
        event["payload"] = json.dumps(
            event["payload"], sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        yield line([event[name] for name in EVENT_FIELDS])


def lines(events: QuerySet[AuditEvent], fmt: str) -> Iterator[str]:
    if fmt not in FORMATS:
        raise ValueError(f"Unknown export format '{fmt}'. Choose one of: {', '.join(FORMATS)}.")
    return jsonl_lines(events) if fmt == "jsonl" else csv_lines(events)


def chunks(text_lines: Iterator[str], size: int = ROWS_PER_CHUNK) -> Iterator[bytes]:
    batch: list[str] = []
    for text in text_lines:
        batch.append(text)
        if len(batch) >= size:
            yield "".join(batch).encode()
            batch = []
    if batch:
        yield "".join(batch).encode()


async def async_chunks(events: QuerySet[AuditEvent], fmt: str) -> AsyncIterator[bytes]:
    """The export for StreamingHttpResponse under ASGI: each chunk is read in the request's
    sync thread (one database connection holds the cursor), and nothing is buffered."""
    source = chunks(lines(events, fmt))

    def read() -> bytes | None:
        return next(source, None)

    def close() -> None:
        source.close()  # type: ignore[attr-defined]  # a generator

    try:
        while (chunk := await sync_to_async(read, thread_sensitive=True)()) is not None:
            yield chunk
    finally:
        await sync_to_async(close, thread_sensitive=True)()
