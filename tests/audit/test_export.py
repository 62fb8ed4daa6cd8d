"""Exports stream in constant memory and carry what a verifier needs, on both backends."""

from __future__ import annotations

import csv
import io
import json
import tracemalloc
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.db import transaction
from django.db.models import QuerySet

from audit import export
from audit.models import AuditEvent
from audit.services import EventSpec, linked_events, record_event
from audit.verify import EVENT_FIELDS, verify_events, verify_file
from dispatcher import agents
from tests.audit.chains import bulk_chain, write_chain
from tests.support.factories import AgentFixture, submit_one

pytestmark = pytest.mark.django_db

NOON = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
AWKWARD = {
    "quote": 'say "hi"',
    "backslashes": "C:\\new\\table \\\\server\\share \\u0041 \\n",
    "controls": "line\nbreak\ttab\rreturn\x01\x1f\x7f",
    "unicode": "é ü 中文 😀 \u2028",
    "nested": {"list": [1, 2.5, -3, True, None, "x"], "empty": {}, "zero": 0.0},
}


def streamed(chain: str, fmt: str) -> tuple[int, int, str]:
    """Export `chain` through the ASGI path; return (bytes, peak traced memory, last line)."""
    events = AuditEvent.objects.filter(chain=chain)

    async def consume() -> tuple[int, str]:
        size, tail = 0, b""
        async for chunk in export.async_chunks(events, fmt):
            size += len(chunk)
            tail = chunk[-2000:]
        return size, tail.decode().strip().split("\n")[-1]

    tracemalloc.start()
    try:
        size, last = async_to_sync(consume)()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return size, peak, last


def exported(events: QuerySet[AuditEvent], fmt: str) -> str:
    return "".join(chunk.data.decode() for chunk in export.export_chunks(events, fmt))


def jsonl(events: QuerySet[AuditEvent]) -> list[Any]:
    """The JSON Lines export parsed (split at "\n" only: a line may hold U+2028)."""
    return [json.loads(line) for line in exported(events, "jsonl").split("\n") if line]


def as_stored(events: QuerySet[AuditEvent]) -> list[dict[str, Any]]:
    """What an export must say about `events`: the ORM's values, created_at as hashed."""
    rows = []
    for values in events.order_by("chain", "seq").values_list(*EVENT_FIELDS):
        row = dict(zip(EVENT_FIELDS, values, strict=True))
        row["created_at"] = row["created_at"].isoformat()
        row["session_id"] = str(row["session_id"]) if row["session_id"] else None
        rows.append(row)
    return rows


def hashed_chain(specs: list[tuple[datetime, str, dict[str, Any]]], session: bool) -> str:
    """A valid chain with the given (created_at, actor, payload) events; no session means a
    chain with no session_id, like the global one."""
    session_id = uuid.uuid4() if session else None
    chain = str(session_id) if session_id else f"test-{uuid.uuid4().hex[:12]}"
    events = (
        EventSpec("call.received", actor, f"call:{seq}" if session else "", payload, at)
        for seq, (at, actor, payload) in enumerate(specs, 1)
    )
    batch = list(linked_events(events, chain=chain, session_id=session_id))
    AuditEvent.objects.bulk_create(batch)
    return chain


@pytest.mark.heavy
@pytest.mark.timeout(600)  # inserting 120,000 events takes a while on a busy machine
def test_exporting_100k_events_uses_no_more_memory_than_20k() -> None:
    small, large = bulk_chain(20_000), bulk_chain(100_000)
    small_size, small_peak, _ = streamed(small, "jsonl")
    large_size, large_peak, last = streamed(large, "jsonl")
    assert large_size > 4.5 * small_size  # five times the data went through ...
    assert large_peak < 1.5 * small_peak + 512 * 1024  # ... in the same memory
    final = json.loads(last)
    assert final["seq"] == 100_000
    assert final["hash"] == AuditEvent.objects.get(chain=large, seq=100_000).hash


def test_jsonl_export_verifies_and_csv_has_every_column() -> None:
    events = write_chain(5)
    chain = events[0].chain
    rows = jsonl(AuditEvent.objects.filter(chain=chain))
    assert [r["seq"] for r in rows] == [1, 2, 3, 4, 5]
    assert verify_events(rows).ok
    csv_text = exported(AuditEvent.objects.filter(chain=chain), "csv")
    assert csv_text.startswith(",".join(EVENT_FIELDS) + "\n")
    table = list(csv.DictReader(io.StringIO(csv_text)))
    assert [int(r["seq"]) for r in table] == [1, 2, 3, 4, 5]
    assert table[-1]["hash"] == events[-1].hash
    assert json.loads(table[1]["payload"])["tool"] == "read_file"


def test_export_writes_created_at_as_hashed_and_every_field_with_its_json_type() -> None:
    """The database formats the rows; what it writes must be what the ORM reads, created_at
    exactly as `record_event` hashed it (isoformat drops a zero fraction, keeps trailing
    zeros of a non-zero one), strings however awkward, the payload as the same JSON."""
    times = [NOON, NOON + timedelta(microseconds=120_000), NOON + timedelta(microseconds=1)]
    times.append(NOON + timedelta(days=200, microseconds=999_999))  # summer: still UTC
    actors = ['rule:allow:run_command(echo "a\\b")', "agent:x", "user:é", "harness"]
    specs = [
        (at, actor, AWKWARD | {"n": n})
        for n, (at, actor) in enumerate(zip(times, actors, strict=True))
    ]
    for session in (True, False):
        events = AuditEvent.objects.filter(chain=hashed_chain(specs, session))
        stored = as_stored(events)
        assert [r["created_at"][19:] for r in stored] == [
            "+00:00",
            ".120000+00:00",
            ".000001+00:00",
            ".999999+00:00",
        ]
        rows = jsonl(events)
        assert rows == stored
        assert [type(rows[0][name]) for name in EVENT_FIELDS] == [
            type(stored[0][name]) for name in EVENT_FIELDS
        ]
        assert verify_events(rows).ok
        table = list(csv.DictReader(io.StringIO(exported(events, "csv"))))
        for row, want in zip(table, stored, strict=True):
            assert json.loads(row.pop("payload")) == want.pop("payload")
            assert row == {k: "" if v is None else str(v) for k, v in want.items()}


def test_export_applies_the_querysets_filters() -> None:
    first, second = write_chain(4), write_chain(3)
    events = AuditEvent.objects.filter(
        chain__in=[first[0].chain, second[0].chain], kind="call.received", seq__gte=3
    )
    rows = jsonl(events)
    assert rows == as_stored(events)
    assert [(r["chain"], r["seq"]) for r in rows] == sorted(
        [(first[0].chain, 3), (first[0].chain, 4), (second[0].chain, 3)]
    )
    table = list(csv.DictReader(io.StringIO(exported(events, "csv"))))
    assert [row["id"] for row in table] == [str(r["id"]) for r in rows]


def test_no_csv_cell_starts_like_a_formula_even_when_the_agent_writes_one(
    agent: AgentFixture,
) -> None:
    """Agent text (title, tool name, arguments, tool-use id) lands only in the payload,
    whose cell starts with "{"; every other cell is a Harness-made value."""
    session = agents.start_session(agent=agent.agent, title='=HYPERLINK("http://x")')
    submit_one(session, "=cmd|' /C calc'!A0", {"path": "-2+3"}, tool_use_id="+evil")
    submit_one(session, "read_file", {"path": "@SUM(1,2)"}, tool_use_id="=x")
    events = AuditEvent.objects.filter(chain=str(session.pk))
    text = exported(events, "csv")
    assert "=cmd|" in text and "@SUM" in text  # the agent's text is there ...
    table = list(csv.reader(io.StringIO(text)))[1:]
    assert len(table) >= 4
    for row in table:
        for cell in row:
            assert not cell or cell[0] not in "=+-@\t\r", (cell, row)  # ... never first
        assert row[EVENT_FIELDS.index("payload")].startswith("{")


def test_exports_carry_the_masked_audit_copy_only() -> None:
    secret = "hunter2-Very-Secret-9f8e"
    with transaction.atomic():
        event = record_event(
            kind="call.received",
            actor="agent:test",
            session_id=uuid.uuid4(),
            payload={"arguments": f"mysql --password={secret} db", "api_key": secret},
        )
    events = AuditEvent.objects.filter(chain=event.chain)
    for fmt in export.FORMATS:
        text = exported(events, fmt)
        assert secret not in text and "[masked:password#" in text
    assert json.loads(exported(events, "jsonl"))["payload"]["masked"] is True


@pytest.mark.django_db(transaction=True)
def test_closing_an_export_early_leaves_the_connection_usable() -> None:
    """A download the client drops: the generator is closed in the middle (PostgreSQL:
    the COPY is cancelled) and the same connection runs the next query."""
    chain = bulk_chain(3 * export.ROWS_PER_CHUNK)
    source = export.export_chunks(AuditEvent.objects.filter(chain=chain), "jsonl")
    assert next(source).events == export.ROWS_PER_CHUNK
    source.close()
    assert AuditEvent.objects.filter(chain=chain).count() == 3 * export.ROWS_PER_CHUNK


def test_an_unknown_format_is_refused_before_any_query() -> None:
    with pytest.raises(ValueError, match="Choose one of: jsonl, csv"):
        export.export_chunks(AuditEvent.objects.none(), "xml")


@pytest.mark.heavy
def test_export_command_writes_a_file_with_a_progress_bar(tmp_path: Path) -> None:
    events = write_chain(1200)
    out, err = io.StringIO(), io.StringIO()
    path = tmp_path / "audit.jsonl"
    call_command(
        "export_audit", "--session", events[0].chain, "--output", str(path), stdout=out, stderr=err
    )
    assert "100% 1200/1200 events" in err.getvalue()
    assert " 1000/1200 events" in err.getvalue()
    assert len(path.read_text().splitlines()) == 1200
    assert verify_file(path).ok


def test_export_command_writes_csv_to_stdout() -> None:
    events = write_chain(3)
    out = io.StringIO()
    call_command(
        "export_audit", "--session", events[0].chain, "--format", "csv", "--no-progress", stdout=out
    )
    table = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert [r["kind"] for r in table] == ["session.started", "call.received", "call.received"]
