"""A1/A2: tampering with stored audit rows is detected by the verifier; untouched
sessions verify. Tampering runs as the database superuser with the append-only triggers
bypassed (PostgreSQL: session_replication_role = replica; SQLite: triggers dropped inside
the transaction), each inside a savepoint that is rolled back afterwards.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.test import Client
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from audit.models import AuditChain
from audit.services import canonical_event, chain_hash
from audit.verify import Report, database_events, database_heads, verify_database, verify_events
from dispatcher.models import AgentSession
from tests.battery import figures
from tests.battery.conftest import POSTGRES, seed_for, size
from tests.support.factories import make_agent, submit_one

pytestmark = pytest.mark.django_db

TABLE = "audit_auditevent"
SESSIONS = size(6, 50)
EVENTS = size(41, 201)  # session.started + 2 events per call
UNTOUCHED = size(4, 50)
TAMPERS = size(60, 500)
COLUMNS = ["kind", "actor", "subject", "payload", "created_at", "prev_hash", "hash", "seq"]
COLUMNS += ["chain", "session_id"]
PARKED = 10**12
# Columns whose text is mostly digits: a replacement byte from their alphabet keeps most
# tampers storable (any other byte is tried too, through the other columns).
DIGITS = {"seq": "0123456789", "created_at": "0123456789", "session_id": "0123456789abcdef"}


class Rollback(Exception):
    pass


@contextlib.contextmanager
def superuser_tamper() -> Iterator[None]:
    """A savepoint in which the triggers do not fire; everything in it is rolled back."""
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                if POSTGRES:
                    cursor.execute("SET LOCAL session_replication_role = replica")
                else:
                    cursor.execute(
                        "SELECT name FROM sqlite_master WHERE type='trigger' AND tbl_name=%s",
                        [TABLE],
                    )
                    for (name,) in cursor.fetchall():
                        cursor.execute(f'DROP TRIGGER "{name}"')
            yield
            raise Rollback
    except Rollback:
        pass
    if POSTGRES:  # SET LOCAL lasts to the end of the outer (test) transaction
        with connection.cursor() as cursor:
            cursor.execute("SET session_replication_role = origin")


def build_sessions(count: int) -> list[str]:
    """`count` sessions of EVENTS events each, through the agent API (reads that run,
    writes that ask, unknown tools rejected)."""
    fx = make_agent(mode="standard")
    client = Client(headers=fx.headers)
    chains = []
    calls = (EVENTS - 1) // 2
    for _ in range(count):
        sid = client.post("/api/v1/sessions", {}, content_type="application/json").json()["id"]
        for start in range(0, calls, 20):
            batch = []
            for n in range(start, min(start + 20, calls)):
                name, args = [
                    ("read_file", {"path": f"f{n}.txt"}),
                    ("write_file", {"path": f"w{n}.txt", "content": f"line {n} ✓"}),
                    ("no_such_tool", {"n": n}),
                ][n % 3]
                batch.append({"id": f"c{n}", "name": name, "arguments": args})
            response = client.post(
                f"/api/v1/sessions/{sid}/calls", {"calls": batch}, content_type="application/json"
            )
            assert response.status_code in (200, 202), response.content
        chains.append(sid)
    return chains


def verify_chains(chains: set[str]) -> Report:
    events = [e for c in sorted(chains) for e in database_events(c)]
    heads = {c: h for c in chains for c, h in database_heads(c).items()}
    return verify_events(events, heads)


def column_text(event_id: int, column: str) -> str:
    cast = "::text" if POSTGRES else ""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column}{cast} FROM {TABLE} WHERE id = %s", [event_id])  # noqa: S608
        value = cursor.fetchone()[0]
    return str(value)


def set_column(event_id: int, column: str, text: str) -> None:
    types = {"payload": "jsonb", "created_at": "timestamptz", "seq": "bigint", "session_id": "uuid"}
    placeholder = f"%s::{types[column]}" if POSTGRES and column in types else "%s"
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {TABLE} SET {column} = {placeholder} WHERE id = %s",  # noqa: S608
            [text, event_id],
        )


def test_a1_one_byte_tampering_is_detected_and_untouched_sessions_verify() -> None:
    seed = seed_for("A1")
    chains = build_sessions(SESSIONS)
    untouched = build_sessions(UNTOUCHED)
    rows = [e for c in chains for e in database_events(c)]
    assert len(rows) == SESSIONS * EVENTS
    false_positives = sum(not verify_chains({c}).ok for c in chains + untouched)
    tried: list[dict[str, Any]] = []
    undetected: list[dict[str, Any]] = []
    mislocated: list[dict[str, Any]] = []

    @hypothesis_seed(seed)
    @settings(
        max_examples=TAMPERS,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(
        row=st.integers(0, len(rows) - 1),
        column=st.sampled_from(COLUMNS),
        position=st.integers(0, 10**6),
        byte=st.integers(0x20, 0x7E),
    )
    def tamper(row: int, column: str, position: int, byte: int) -> None:
        event = rows[row]
        with superuser_tamper():
            original = column_text(event["id"], column)
            index = position % len(original)
            alphabet = DIGITS.get(column)
            char = alphabet[byte % len(alphabet)] if alphabet else chr(byte)
            assume(original[index] != char)
            changed = original[:index] + char + original[index + 1 :]
            try:
                with transaction.atomic():
                    set_column(event["id"], column, changed)
            except (DatabaseError, ValueError):
                assume(False)  # not a value the column can hold: no tamper happened
            after = [
                e for c in {event["chain"], _chain_of(event["id"])} for e in database_events(c)
            ]
            now = next(e for e in after if e["id"] == event["id"])
            assume(now != event)  # the database normalized it back (jsonb spacing)
            report = verify_chains({event["chain"], now["chain"]})
        case = {
            "event": event["id"],
            "seq": event["seq"],
            "column": column,
            "at": index,
            "byte": byte,
        }
        tried.append(case)
        if report.ok:
            undetected.append(case)
        elif not any(_names(p, event, now) for p in report.problems):
            mislocated.append({**case, "problems": [str(p) for p in report.problems]})

    tamper()
    by_column = {c: sum(1 for t in tried if t["column"] == c) for c in COLUMNS}
    missed_columns = sorted({u["column"] for u in undetected})
    figures.record(
        "A1",
        "one-byte tampers detected / tried",
        f"{len(tried) - len(undetected)}/{len(tried)}",
        "all detected",
        not undetected and len(tried) >= TAMPERS * 0.5,
        by_column=by_column,
        undetected=undetected[:20],
        missed_columns=missed_columns,
    )
    figures.record(
        "A1",
        "first bad seq named = tampered row",
        f"{len(tried) - len(undetected) - len(mislocated)}/{len(tried) - len(undetected)}",
        "all",
        not mislocated,
        mislocated=mislocated[:10],
    )
    figures.record(
        "A1",
        "false positives on untouched sessions",
        f"{false_positives}/{len(chains) + len(untouched)}",
        "0",
        false_positives == 0,
    )
    assert not undetected, f"undetected tampers (columns {missed_columns}): {undetected[:5]}"
    assert not mislocated, mislocated[:5]
    assert false_positives == 0


def _names(problem: Any, event: dict[str, Any], now: dict[str, Any]) -> bool:
    """The finding points at the tampered row: at its seq, at the seq it was moved to, or
    as the seq missing where it was."""
    seqs = {event["seq"], now["seq"]}
    return problem.seq in seqs or f"missing seq {event['seq']}" in problem.what


def _chain_of(event_id: int) -> str:
    return column_text(event_id, "chain")


def _forged(event: dict[str, Any], seq: int, prev_hash: str) -> dict[str, Any]:
    """A well-formed event at `seq` after `prev_hash`, with a correct hash of its own."""
    forged = {**event, "seq": seq, "prev_hash": prev_hash, "actor": "user:mallory"}
    canonical = canonical_event(
        chain=forged["chain"],
        seq=seq,
        kind=forged["kind"],
        actor=forged["actor"],
        subject=forged["subject"],
        payload=forged["payload"],
        created_at=forged["created_at"],
    )
    forged["hash"] = chain_hash(prev_hash, canonical)
    return forged


def _insert(event: dict[str, Any]) -> None:
    payload = "%s::jsonb" if POSTGRES else "%s"
    session_id = event["session_id"]
    if not POSTGRES and session_id is not None:
        session_id = str(session_id).replace("-", "")
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (chain, session_id, seq, kind, actor, subject, payload,"  # noqa: S608
            f" created_at, prev_hash, hash) VALUES (%s, %s, %s, %s, %s, %s, {payload}, %s, %s, %s)",
            [
                event["chain"],
                session_id,
                event["seq"],
                event["kind"],
                event["actor"],
                event["subject"],
                json.dumps(event["payload"]),
                event["created_at"],
                event["prev_hash"],
                event["hash"],
            ],
        )


def _sql(statement: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def test_a2_delete_swap_insert_and_truncation_are_detected() -> None:
    seed = seed_for("A2")
    rng = random.Random(seed)
    chains = build_sessions(size(6, 100) // 2)
    outcomes: dict[str, list[bool]] = {}

    def attack(name: str, chain: str, action: Any) -> None:
        events = list(database_events(chain))
        with superuser_tamper():
            action(events)
            report = verify_chains({chain})
        outcomes.setdefault(name, []).append(not report.ok)

    def delete(events: list[dict[str, Any]]) -> None:
        victim = rng.choice(events[:-1])  # the last one is truncation, below
        _sql(f"DELETE FROM {TABLE} WHERE id = %s", [victim["id"]])  # noqa: S608

    def swap(events: list[dict[str, Any]]) -> None:
        a, b = rng.sample(events, 2)
        _sql(f"UPDATE {TABLE} SET seq = %s WHERE id = %s", [PARKED, a["id"]])  # noqa: S608
        _sql(f"UPDATE {TABLE} SET seq = %s WHERE id = %s", [a["seq"], b["id"]])  # noqa: S608
        _sql(f"UPDATE {TABLE} SET seq = %s WHERE id = %s", [b["seq"], a["id"]])  # noqa: S608

    def insert_middle(events: list[dict[str, Any]]) -> None:
        # Replace one event by a forged one that links to its predecessor correctly.
        index = rng.randrange(1, len(events) - 1)
        victim, before = events[index], events[index - 1]
        _sql(f"DELETE FROM {TABLE} WHERE id = %s", [victim["id"]])  # noqa: S608
        _insert(_forged(victim, victim["seq"], before["hash"]))

    def insert_tail(events: list[dict[str, Any]]) -> None:
        last = events[-1]
        _insert(_forged(last, last["seq"] + 1, last["hash"]))

    def truncate(k: int) -> Any:
        def run(events: list[dict[str, Any]]) -> None:
            for event in events[-k:]:
                _sql(f"DELETE FROM {TABLE} WHERE id = %s", [event["id"]])  # noqa: S608

        return run

    for chain in chains:
        attack("delete", chain, delete)
        attack("swap", chain, swap)
        attack("insert (re-linked forgery)", chain, insert_middle)
        attack("insert (appended forgery)", chain, insert_tail)
        for k in (1, 5, 50):
            if k < EVENTS:
                attack(f"truncate tail k={k} (head row kept)", chain, truncate(k))
    all_ok = True
    for name, results in outcomes.items():
        ok = all(results)
        all_ok &= ok
        figures.record(
            "A2", f"{name}: detected / tried", f"{sum(results)}/{len(results)}", "all", ok
        )
    assert all_ok, outcomes


def test_a2_a_rolled_back_or_rewritten_head_is_detected_against_a_signed_checkpoint(
    tmp_path: Path,
) -> None:
    """Against the signed checkpoints (`manage.py audit_checkpoint`, `verify_audit
    --against`): an attacker who can write the database but not read the audit key
    (1) truncates a chain and rewrites its head row to the new end: the head's signature
    no longer verifies; (2) truncates it back to an earlier head row, validly signed (kept
    from a backup): the database alone is consistent again, only the checkpoint taken
    since can tell. Each session is checkpointed and verified on its own (--session):
    other tests of this run commit chains of their own, some tampered on purpose."""
    chains = build_sessions(size(2, 10))
    outcomes: dict[str, list[bool]] = {
        "untouched chain verifies against its checkpoint": [],
        "truncation with the head rewritten, without the key: detected": [],
        "rollback to an earlier signed head: the database alone verifies": [],
        "rollback to an earlier signed head: detected against the checkpoint": [],
    }
    heads = AuditChain.objects.values(
        "last_seq", "last_hash", "head_signature", "last_at", "last_event_id"
    )
    for n, chain in enumerate(chains):
        earlier = heads.get(chain=chain)  # what a backup taken now holds
        session = AgentSession.objects.get(pk=chain)
        for k in range(3):  # the session goes on: 3 calls after the backup
            submit_one(session, "read_file", {"path": f"late{k}.txt"}, f"late{n}-{k}")
        path = tmp_path / f"checkpoints-{n}.jsonl"
        call_command("audit_checkpoint", "--output", str(path), "--session", chain)
        [line] = path.read_text().splitlines()  # this session's head only
        assert json.loads(line)["chain"] == chain
        outcomes["untouched chain verifies against its checkpoint"].append(
            not _verify_against_fails(chain, path)
        )
        events = list(database_events(chain))
        cut = [e for e in events if e["seq"] > earlier["last_seq"]]
        with superuser_tamper():
            for event in cut:
                _sql(f"DELETE FROM {TABLE} WHERE id = %s", [event["id"]])  # noqa: S608
            last = events[-len(cut) - 1]
            _sql(
                "UPDATE audit_auditchain SET last_seq = %s, last_hash = %s, last_event_id = %s"
                " WHERE chain = %s",
                [last["seq"], last["hash"], last["id"], chain],
            )
            outcomes["truncation with the head rewritten, without the key: detected"].append(
                not verify_database(chain).ok and _verify_against_fails(chain, path)
            )
            AuditChain.objects.filter(chain=chain).update(**earlier)
            outcomes["rollback to an earlier signed head: the database alone verifies"].append(
                verify_database(chain).ok
            )
            outcomes["rollback to an earlier signed head: detected against the checkpoint"].append(
                _verify_against_fails(chain, path)
            )
    for name, results in outcomes.items():
        figures.record("A2", f"{name}", f"{sum(results)}/{len(results)}", "all", all(results))
    assert all(all(results) for results in outcomes.values()), outcomes


def _verify_against_fails(chain: str, path: Path) -> bool:
    try:
        call_command(
            "verify_audit",
            "--session",
            chain,
            "--against",
            str(path),
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )
    except CommandError:
        return True
    return False
