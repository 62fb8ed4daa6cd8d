"""verify_audit detects any single edited, deleted, inserted or reordered event, and names it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from audit.models import AuditEvent
from audit.services import canonical_event, chain_hash
from audit.verify import verify_database, verify_file
from tests.audit.chains import write_chain
from tests.audit.tamper import sql, triggers_disabled

pytestmark = pytest.mark.django_db

LENGTH = 12
PARKED_SEQ = 10**9  # out of the way while two events swap seqs (unique chain+seq)


def run_verify(*args: str) -> tuple[bool, str]:
    out, err = [], []

    class Sink:
        def __init__(self, into: list[str]) -> None:
            self.into = into

        def write(self, text: str) -> None:
            self.into.append(text)

        def flush(self) -> None:
            pass

    try:
        call_command("verify_audit", *args, stdout=Sink(out), stderr=Sink(err))
    except CommandError as error:
        return False, "".join(err) + str(error)
    return True, "".join(out)


def json_sql() -> str:
    return "%s::jsonb" if connection.vendor == "postgresql" else "%s"


def edit(events: list[AuditEvent], rng: random.Random) -> tuple[int, int | None]:
    target = rng.choice(events)
    column, value = rng.choice(
        [
            ("payload", json.dumps({**target.payload, "arguments": '{"path": "/etc/shadow"}'})),
            ("kind", "call.approved"),
            ("actor", "user:mallory"),
            ("subject", "call:forged"),
        ]
    )
    placeholder = json_sql() if column == "payload" else "%s"
    sql(f"UPDATE audit_auditevent SET {column} = {placeholder} WHERE id = %s", [value, target.pk])  # noqa: S608
    return target.seq, target.pk


def delete(events: list[AuditEvent], rng: random.Random) -> tuple[int, int | None]:
    target = rng.choice(events)
    sql("DELETE FROM audit_auditevent WHERE id = %s", [target.pk])
    if target.seq == len(events):
        return target.seq, None  # the end of the chain: only the head knows it existed
    return target.seq + 1, events[target.seq].pk


def insert(events: list[AuditEvent], rng: random.Random) -> tuple[int, int | None]:
    last = events[-1]
    seq = last.seq + rng.choice([1, 1, 3])
    payload = {"call_id": "forged", "tool": "run_command", "arguments": '{"command": "id"}'}
    created_at = last.created_at.isoformat()
    clever = rng.random() < 0.5  # a forger who computes a valid hash for the link
    canonical = canonical_event(
        chain=last.chain,
        seq=seq,
        kind="call.allowed",
        actor="user:mallory",
        subject="call:forged",
        payload=payload,
        created_at=created_at,
    )
    digest = chain_hash(last.hash, canonical) if clever else "f" * 64
    columns = "chain, session_id, seq, kind, actor, subject, payload, created_at, prev_hash, hash"
    placeholders = ", ".join(["%s"] * 6 + [json_sql()] + ["%s"] * 3)
    sql(
        f"INSERT INTO audit_auditevent ({columns}) VALUES ({placeholders})",  # noqa: S608
        [
            last.chain,
            last.session_id.hex if connection.vendor == "sqlite" else last.session_id,
            seq,
            "call.allowed",
            "user:mallory",
            "call:forged",
            json.dumps(payload),
            last.created_at,
            last.hash,
            digest,
        ],
    )
    forged = AuditEvent.objects.get(chain=last.chain, seq=seq)
    return seq, forged.pk


def swap(events: list[AuditEvent], rng: random.Random) -> tuple[int, int | None]:
    a, b = sorted(rng.sample(events, 2), key=lambda e: e.seq)
    sql("UPDATE audit_auditevent SET seq = %s WHERE id = %s", [PARKED_SEQ, a.pk])
    sql("UPDATE audit_auditevent SET seq = %s WHERE id = %s", [a.seq, b.pk])
    sql("UPDATE audit_auditevent SET seq = %s WHERE id = %s", [b.seq, a.pk])
    return a.seq, b.pk  # at a's place now sits b


TAMPERINGS = {"edit": edit, "delete": delete, "insert": insert, "swap": swap}


def test_an_untouched_chain_verifies() -> None:
    events = write_chain(LENGTH)
    ok, output = run_verify("--session", events[0].chain)
    assert ok, output
    assert f"1 chains, {LENGTH} events verified" in output


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("tampering", TAMPERINGS)
def test_any_single_tampering_is_detected_and_named(tampering: str, seed: int) -> None:
    rng = random.Random(f"{tampering}-{seed}")
    events = write_chain(LENGTH)
    chain = events[0].chain
    with triggers_disabled():
        bad_seq, bad_id = TAMPERINGS[tampering](events, rng)

    report = verify_database(chain)
    assert not report.ok
    problem = report.problems[0]
    assert (problem.chain, problem.seq, problem.event_id) == (chain, bad_seq, bad_id)
    ok, output = run_verify("--session", chain)
    assert not ok
    assert f"chain {chain} seq {bad_seq}" in output
    if bad_id is not None:
        assert f"(event id {bad_id})" in output
    expected_words = {
        "edit": "hash mismatch",
        "delete": "missing",
        "insert": "inserted",
        "swap": "reordered",
    }
    assert expected_words[tampering] in problem.what


def test_the_whole_database_is_checked_without_session(tmp_path: Path) -> None:
    good, bad = write_chain(3), write_chain(3)
    with triggers_disabled():
        sql("UPDATE audit_auditevent SET actor = 'x' WHERE id = %s", [bad[1].pk])
    ok, output = run_verify()
    assert not ok
    assert f"chain {bad[0].chain} seq 2 (event id {bad[1].pk})" in output
    assert good[0].chain not in output


def test_an_unknown_session_is_an_error_not_a_pass() -> None:
    ok, output = run_verify("--session", "00000000-0000-0000-0000-000000000000")
    assert not ok
    assert "No audit events" in output


def test_a_tampered_export_file_is_detected(tmp_path: Path) -> None:
    events = write_chain(6)
    chain = events[0].chain
    path = tmp_path / "export.jsonl"
    call_command("export_audit", "--session", chain, "--output", str(path), "--no-progress")
    assert verify_file(path).ok
    ok, output = run_verify("--file", str(path))
    assert ok, output
    lines = path.read_text().splitlines()
    record = json.loads(lines[3])
    record["payload"]["tool"] = "run_command"
    lines[3] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
    ok, output = run_verify("--file", str(path))
    assert not ok
    assert f"seq 4 (event id {events[3].pk}): hash mismatch" in output
