"""Exports stream in constant memory and carry what a verifier needs."""

from __future__ import annotations

import csv
import io
import json
import tracemalloc
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command

from audit import export
from audit.models import AuditEvent
from audit.verify import verify_events, verify_file
from tests.audit.chains import bulk_chain, write_chain

pytestmark = pytest.mark.django_db


def streamed(chain: str, fmt: str) -> tuple[int, int, str]:
    """Export `chain` through the ASGI path; return (bytes, peak traced memory, last line)."""
    events = AuditEvent.objects.filter(chain=chain)

    async def consume() -> tuple[int, str]:
        size, tail = 0, b""
        async for chunk in export.async_chunks(events, fmt):
            size += len(chunk)
            tail = chunk[-2000:]
        return size, tail.decode().strip().splitlines()[-1]

    tracemalloc.start()
    try:
        size, last = async_to_sync(consume)()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return size, peak, last


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
    text = b"".join(export.chunks(export.lines(AuditEvent.objects.filter(chain=chain), "jsonl")))
    rows = [json.loads(line) for line in text.decode().splitlines()]
    assert [r["seq"] for r in rows] == [1, 2, 3, 4, 5]
    assert verify_events(rows).ok
    csv_text = "".join(export.lines(AuditEvent.objects.filter(chain=chain), "csv"))
    table = list(csv.DictReader(io.StringIO(csv_text)))
    assert [int(r["seq"]) for r in table] == [1, 2, 3, 4, 5]
    assert table[-1]["hash"] == events[-1].hash
    assert json.loads(table[1]["payload"])["tool"] == "read_file"


def test_export_command_writes_a_file_with_a_progress_bar(tmp_path: Path) -> None:
    events = write_chain(300)
    out, err = io.StringIO(), io.StringIO()
    path = tmp_path / "audit.jsonl"
    call_command(
        "export_audit", "--session", events[0].chain, "--output", str(path), stdout=out, stderr=err
    )
    assert "100% 300/300 events" in err.getvalue()
    assert len(path.read_text().splitlines()) == 300
    assert verify_file(path).ok


def test_export_command_writes_csv_to_stdout() -> None:
    events = write_chain(3)
    out = io.StringIO()
    call_command(
        "export_audit", "--session", events[0].chain, "--format", "csv", "--no-progress", stdout=out
    )
    table = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert [r["kind"] for r in table] == ["session.started", "call.received", "call.received"]
