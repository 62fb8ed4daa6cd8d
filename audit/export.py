"""Streaming exports of the log as JSON Lines or CSV, in constant memory.

The database formats the rows; Python only passes their text on. One SELECT, built from the
caller's queryset (so its filters apply) and ordered by chain and seq, turns each event into
text: for JSON Lines one JSON object per row, for CSV the 11 columns as text. On PostgreSQL
that SELECT streams through `COPY (SELECT ...) TO STDOUT` (psycopg `cursor.copy`, one
message per row, passed on in chunks of whole rows), so an export runs at close to COPY's
own rate; on SQLite (the embedded default) the same SELECT is read with a cursor, a chunk at
a time. Nothing holds more than one chunk.

JSON Lines carries every field that is hashed plus prev_hash and hash, so `verify_audit
--file` (or the recipe in docs/audit.md) can check an export on another machine:
`created_at` is the text that was hashed (`datetime.isoformat()` of the stored UTC time) and
the payload is the JSON the database stores (the verifier parses it, so its spacing and key
order do not matter). CSV has the same columns, the payload as that stored JSON text.
"""

from __future__ import annotations

import csv
import io
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator
from itertools import islice
from typing import Any, NamedTuple

import psycopg
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.db.models import QuerySet

from .models import AuditEvent
from .verify import EVENT_FIELDS

FORMATS = {
    "jsonl": ("application/x-ndjson; charset=utf-8", "jsonl"),
    "csv": ("text/csv; charset=utf-8", "csv"),
}
ROWS_PER_CHUNK = 500
CSV_HEADER = (",".join(EVENT_FIELDS) + "\n").encode()


class Chunk(NamedTuple):
    """Whole rows of an export: how many events they hold, and their bytes (UTF-8)."""

    events: int
    data: bytes


# How each column becomes the export's text where the database's own text is not it.
# created_at: `datetime.isoformat()` of the UTC value, as `record_event` hashed it
# ("2026-01-01T12:00:00.120000+00:00"; no fraction when it is zero). SQLite stores str() of
# the naive UTC datetime ("YYYY-MM-DD HH:MM:SS[.ffffff]") and a UUID as its 32 hex digits.
PG_ISO_TIME = (
    "replace(to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US'), "
    "'.000000', '') || '+00:00'"
)
SQLITE_ISO_TIME = "replace(created_at, ' ', 'T') || '+00:00'"
SQLITE_UUID = " || '-' || ".join(
    f"substr(session_id, {start}, {length})"
    for start, length in ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))
)


def _cells(vendor: str, fmt: str) -> list[str]:
    """The SQL of each EVENT_FIELDS cell, over a subquery that selects the columns."""
    cells = {name: name for name in EVENT_FIELDS}
    if vendor == "postgresql":
        cells["created_at"] = PG_ISO_TIME  # uuid and jsonb print as their text already
    else:
        cells.update(created_at=SQLITE_ISO_TIME, session_id=SQLITE_UUID)
        if fmt == "jsonl":
            cells["payload"] = "json(payload)"  # stored as text: json() embeds it as JSON
    return list(cells.values())


def select(events: QuerySet[AuditEvent], fmt: str) -> tuple[str, tuple[Any, ...]]:
    """The SQL (and its parameters) that formats `events` for `fmt`, in chain and seq order:
    one JSON object text per row for JSON Lines, the 11 cells as text for CSV.

    The queryset (with its filters) becomes a subquery of the plain columns, ordered, and the
    formatting is done over it: the shape of `COPY (SELECT row_to_json(t) FROM (...) t)`, so
    PostgreSQL reads the (chain, seq) index in order and the first rows leave at once, rather
    than sorting the whole selection first (which it may choose when the formatting
    expressions sit in the same SELECT as the scan).
    """
    vendor = connections[events.db].vendor
    inner = events.order_by("chain", "seq").values_list(*EVENT_FIELDS).query
    sql, params = inner.get_compiler(using=events.db).as_sql()
    cells = zip(EVENT_FIELDS, _cells(vendor, fmt), strict=True)
    if fmt == "jsonl" and vendor != "postgresql":
        columns = "json_object(" + ", ".join(f"'{name}', {cell}" for name, cell in cells) + ")"
    else:
        columns = ", ".join(f"{cell} AS {name}" for name, cell in cells)
    # S608: fixed SQL around the queryset's compiled SQL, whose values stay parameters.
    rows = f"SELECT {columns} FROM ({sql}) AS event ORDER BY chain, seq"  # noqa: S608
    if fmt == "jsonl" and vendor == "postgresql":  # row_to_json: the keys are the aliases
        rows = f"SELECT row_to_json(line) FROM ({rows}) AS line ORDER BY line.chain, line.seq"  # noqa: S608
    return rows, tuple(params)


def _copied_chunks(events: QuerySet[AuditEvent], fmt: str) -> Iterator[Chunk]:
    """PostgreSQL: stream `COPY (SELECT ...) TO STDOUT`, one message per row.

    CSV is COPY's own CSV. JSON Lines is COPY's text format of one JSON text column: that
    format doubles every backslash and escapes control characters, which JSON text never
    holds unescaped, so undoing the doubling gives the JSON back exactly. COPY takes no bind
    parameters: they are merged into the statement client-side (psycopg quotes them).
    Closing the generator early (a dropped download) cancels the COPY (psycopg) and leaves
    the connection usable; inside a transaction block the cancel also aborts that block.
    """
    sql, params = select(events, fmt)
    options = " (FORMAT csv)" if fmt == "csv" else ""
    connection = connections[events.db]
    with connection.cursor() as cursor, connection.wrap_database_errors:
        raw = cursor.cursor
        statement = psycopg.ClientCursor(raw.connection).mogrify(
            f"COPY ({sql}) TO STDOUT{options}", params
        )
        with raw.copy(statement) as copy:
            rows = iter(copy)
            while chunk := list(islice(rows, ROWS_PER_CHUNK)):
                yield _copied(chunk, fmt)


def _copied(rows: list[Any], fmt: str) -> Chunk:
    data = b"".join(rows)
    return Chunk(len(rows), data if fmt == "csv" else data.replace(b"\\\\", b"\\"))


def _fetched_chunks(events: QuerySet[AuditEvent], fmt: str) -> Iterator[Chunk]:
    """SQLite: the same SELECT through a cursor, ROWS_PER_CHUNK rows at a time."""
    sql, params = select(events, fmt)
    with connections[events.db].cursor() as cursor:
        cursor.execute(sql, params)
        while rows := cursor.fetchmany(ROWS_PER_CHUNK):
            if fmt == "jsonl":
                text = "".join([f"{line}\n" for (line,) in rows])
            else:
                buffer = io.StringIO()
                csv.writer(buffer, lineterminator="\n").writerows(rows)
                text = buffer.getvalue()
            yield Chunk(len(rows), text.encode())


def export_chunks(events: QuerySet[AuditEvent], fmt: str) -> Generator[Chunk]:
    """`events` exported as `fmt`, in chunks of whole rows; CSV starts with its header row.

    Raises ValueError for an unknown format (at the call, before any query runs).
    """
    if fmt not in FORMATS:
        raise ValueError(f"Unknown export format '{fmt}'. Choose one of: {', '.join(FORMATS)}.")

    def generate() -> Generator[Chunk]:
        if fmt == "csv":
            yield Chunk(0, CSV_HEADER)
        if connections[events.db].vendor == "postgresql":
            yield from _copied_chunks(events, fmt)
        else:
            yield from _fetched_chunks(events, fmt)

    return generate()


async def async_chunks(events: QuerySet[AuditEvent], fmt: str) -> AsyncIterator[bytes]:
    """The export for StreamingHttpResponse under ASGI: each chunk is read in the request's
    sync thread (one database connection holds the cursor), and nothing is buffered."""
    source = export_chunks(events, fmt)

    def read() -> bytes | None:
        chunk = next(source, None)
        return None if chunk is None else chunk.data

    try:
        while (data := await sync_to_async(read, thread_sensitive=True)()) is not None:
            yield data
    finally:
        await sync_to_async(source.close, thread_sensitive=True)()


ORGANIZATION = "organization"
"""The share of the export slots organization-wide auditors hold between them (a "team"
of their own in `Slots.take`)."""
LAST_SLOT = "last slot"
"""`Slots.take`'s refusal of the last free slot to a team that already holds one."""


class Slots:
    """The exports this process streams at once: at most settings.HARNESS_MAX_EXPORTS in
    all (0: no cap); at most settings.HARNESS_MAX_EXPORTS_PER_PERSON of one person's and
    at most settings.HARNESS_MAX_EXPORTS_PER_TEAM of the auditors of one team between them
    (0: no share of their own). An export holds a database connection for as long as its
    client takes to read it (a response goes no faster: harness_site.slow_clients), and
    the connections of a process are few (HARNESS_DB_POOL_MAX): without a cap, a few slow
    downloads held every connection, and every other page of the process waited for one.
    Without a person's share, one auditor whose slow readers held every slot (each as long
    as it took a little within HARNESS_RESPONSE_STALL_TIMEOUT, reconnecting when cut) had
    every other auditor's export refused; without a team's, a team's few auditors did so
    between them, and every other team's auditors were refused.

    The last free slot is kept for a team whose auditors hold none (while
    HARNESS_MAX_EXPORTS_PER_TEAM is set): without it, two teams' auditors at their share
    (2 of the 4 slots each, by default) held every slot, and every other team's auditors
    were refused for as long as they kept exporting."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self._held: dict[tuple[str, Any], int] = {}

    def refusal(self, person: Any, teams: Iterable[Any]) -> str | None:
        """Why `take(person, teams)` would be refused now (see `take`), or None: asked
        before a long page is rendered, so a refused request does no work for nothing."""
        with self._lock:
            return self._refusal(self._holders(person, teams))

    @staticmethod
    def _holders(person: Any, teams: Iterable[Any]) -> list[tuple[str, Any]]:
        return [("person", person), *(("team", team) for team in set(teams))]

    def _refusal(self, holders: list[tuple[str, Any]]) -> str | None:
        shares = {
            "person": settings.HARNESS_MAX_EXPORTS_PER_PERSON,
            "team": settings.HARNESS_MAX_EXPORTS_PER_TEAM,
        }
        for holder in holders:
            share = shares[holder[0]]
            if share and self._held.get(holder, 0) >= share:
                return f"HARNESS_MAX_EXPORTS_PER_{holder[0].upper()}"
        cap = settings.HARNESS_MAX_EXPORTS
        if cap and self.running >= cap:
            return "HARNESS_MAX_EXPORTS"
        holding = any(self._held.get(h) for h in holders if h[0] == "team")
        if cap and shares["team"] and holding and self.running + 1 >= cap:
            return LAST_SLOT
        return None

    def take(self, person: Any, teams: Iterable[Any]) -> Callable[[], None] | str:
        """A slot's release (call it once the export's response is closed; calling it
        again does nothing), or, when no slot may be taken, why: the setting that refuses
        it ("HARNESS_MAX_EXPORTS_PER_PERSON", "HARNESS_MAX_EXPORTS_PER_TEAM" or
        "HARNESS_MAX_EXPORTS"), or LAST_SLOT when it is the last free slot and one of
        `teams` already holds a slot.

        `teams` are the teams whose share the export counts against: every team the
        person reaches as an auditor, or [ORGANIZATION] for one who reaches them all. An
        auditor of several teams counts against each (they read each one's sessions), so
        the auditors of one team hold at most its share whatever other teams they are in,
        and take the last slot only when none of their teams holds one.
        """
        holders = self._holders(person, teams)
        with self._lock:
            if refused := self._refusal(holders):
                return refused
            self.running += 1
            for holder in holders:
                self._held[holder] = self._held.get(holder, 0) + 1
        released = threading.Event()

        def release() -> None:
            with self._lock:
                if not released.is_set():
                    released.set()
                    self.running -= 1
                    for holder in holders:
                        left = self._held.pop(holder) - 1
                        if left:
                            self._held[holder] = left

        return release


SLOTS = Slots()
