"""A5: the audit insert is made to fail while calls arrive and reviewers decide: nothing is
decided or run without its committed record. A6: many writers append to one chain: no
gaps, no forks, no deadlock reaches a caller.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.test import Client

from approvals import services as approvals
from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from audit.services import record_event
from audit.verify import verify_database
from dispatcher import agents
from dispatcher.models import Status, ToolCall
from tests.battery import figures
from tests.battery.conftest import POSTGRES, size
from tests.support.factories import make_agent, make_user, unique

CALLS = size(40, 200)
WRITERS = 16
EVENTS_PER_WRITER = size(40, 500)


def _break_with_trigger(body: str) -> Callable[[], contextlib.AbstractContextManager[None]]:
    @contextlib.contextmanager
    def fault() -> Iterator[None]:
        name = f"battery_a5_{uuid.uuid4().hex[:8]}"
        with connection.cursor() as cursor:
            if POSTGRES:
                cursor.execute(
                    f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN {body} END $$"
                )
                cursor.execute(
                    f"CREATE TRIGGER {name} BEFORE INSERT ON audit_auditevent "
                    f"FOR EACH ROW EXECUTE FUNCTION {name}()"
                )
            else:
                cursor.execute(
                    f"CREATE TRIGGER {name} BEFORE INSERT ON audit_auditevent "
                    "BEGIN SELECT RAISE(ABORT, 'audit store unavailable'); END"
                )
        try:
            yield
        finally:
            connection.close()  # a terminated backend leaves a dead connection behind
            with connection.cursor() as cursor:
                if POSTGRES:
                    cursor.execute(f"DROP TRIGGER {name} ON audit_auditevent")
                    cursor.execute(f"DROP FUNCTION {name}()")
                else:
                    cursor.execute(f'DROP TRIGGER "{name}"')

    return fault


@contextlib.contextmanager
def revoked_insert() -> Iterator[None]:
    """The application's role loses INSERT on the audit table (SET ROLE to a role without it)."""
    role = f"battery_app_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} NOLOGIN")
        cursor.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        cursor.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}")
        cursor.execute(f"REVOKE INSERT ON audit_auditevent FROM {role}")
        cursor.execute(f"SET ROLE {role}")
    try:
        yield
    finally:
        if not connection.is_usable():
            connection.close()
        with connection.cursor() as cursor:  # pooled connections keep their role: reset it
            cursor.execute("RESET ROLE")
        with connection.cursor() as cursor:
            cursor.execute(f"DROP OWNED BY {role}")
            cursor.execute(f"DROP ROLE {role}")


@contextlib.contextmanager
def lock_held() -> Iterator[None]:
    """Another transaction holds a lock that blocks audit inserts; ours gives up after 200 ms."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("LOCK TABLE audit_auditevent IN SHARE MODE")
                taken.set()
                release.wait(120)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert taken.wait(10)
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '200ms'")
    try:
        yield
    finally:
        release.set()
        holder.join(10)
        if not connection.is_usable():
            connection.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")


FAULTS: dict[str, Any] = {
    "trigger refuses the insert": _break_with_trigger("RAISE EXCEPTION 'audit store unavailable';"),
}
if POSTGRES:
    FAULTS.update(
        {
            "REVOKE INSERT": revoked_insert,
            "backend terminated during the insert": _break_with_trigger(
                "PERFORM pg_terminate_backend(pg_backend_pid());"
            ),
            "lock timeout": lock_held,
        }
    )


@pytest.mark.timeout(600)
def test_a5_nothing_is_decided_or_run_without_its_committed_audit_record(
    battery_db: None,
) -> None:
    reviewer = make_user(unique("rev"), groups=("reviewer",))
    per_fault = max(1, CALLS // len(FAULTS))
    statuses: dict[int, int] = {}
    leaks: list[str] = []
    refused_decisions = 0
    recovered: list[float] = []
    for name, fault in FAULTS.items():
        trusted = make_agent(mode="trusted")
        asker = make_agent(mode="standard")
        session = agents.start_session(agent=trusted.agent)
        ask_session = agents.start_session(agent=asker.agent)
        pending = [_ask(asker, ask_session.pk, f"p{i}") for i in range(max(2, per_fault // 10))]
        bodies = [
            {
                "calls": [
                    {
                        "id": f"c{i}",
                        "name": "write_file",
                        "arguments": {"path": f"f{i}.txt", "content": "x"},
                    }
                ]
            }
            for i in range(per_fault)
        ]
        with fault():
            for index, body in enumerate(bodies):
                status = _post(trusted, session.pk, body)
                statuses[status] = statuses.get(status, 0) + 1
                if index < len(pending):
                    try:
                        approvals.decide(
                            approval_id=pending[index].pk,
                            user=reviewer,
                            approve=True,
                            digest=pending[index].call.digest,
                        )
                    except DatabaseError:
                        refused_decisions += 1
                    finally:
                        if not connection.is_usable():
                            connection.close()
        # What is stored now, with the fault gone.
        received = set(
            AuditEvent.objects.filter(chain=str(session.pk), kind="call.received").values_list(
                "subject", flat=True
            )
        )
        for call in ToolCall.objects.filter(session=session):
            if f"call:{call.pk}" not in received:
                leaks.append(f"{name}: call {call.tool_use_id} stored without call.received")
        ran = list(Path(session.workspace).glob("f*.txt"))
        leaks += [f"{name}: {p.name} written" for p in ran]
        for approval in pending:
            call = ToolCall.objects.get(pk=approval.call_id)
            decided = AuditEvent.objects.filter(
                subject=f"call:{call.pk}", kind__in=["call.approved", "call.denied"]
            ).exists()
            if call.status != Status.PENDING_APPROVAL and not decided:
                leaks.append(f"{name}: {call.tool_use_id} decided without its event")
        started = time.monotonic()
        probe = {
            "calls": [
                {"id": "probe", "name": "write_file", "arguments": {"path": "p", "content": "x"}}
            ]
        }
        while _post(asker, ask_session.pk, probe) not in (200, 202):
            assert time.monotonic() - started < 10, f"{name}: no recovery within 10 s"
            time.sleep(0.2)
        recovered.append(time.monotonic() - started)
    calls = sum(statuses.values())
    figures.record(
        "A5",
        "calls decided or run without a committed record",
        len(leaks),
        "0",
        not leaks,
        faults=list(FAULTS),
        leaks=leaks[:20],
    )
    figures.record(
        "A5",
        "answers during the fault",
        ", ".join(f"{n}x{s}" for s, n in sorted(statuses.items())),
        "503 for all",
        statuses.get(503, 0) == calls,
    )
    figures.record(
        "A5",
        "decisions refused during the fault",
        f"{refused_decisions}/{sum(max(2, per_fault // 10) for _ in FAULTS)}",
        "all refused",
        refused_decisions == sum(max(2, per_fault // 10) for _ in FAULTS),
    )
    figures.record("A5", "recovery after the fault (max s)", round(max(recovered), 2), "< 10", True)
    if not POSTGRES:
        figures.skipped("A5", "REVOKE, terminated backend, lock timeout", "PostgreSQL only")
    assert not leaks, leaks
    assert statuses.get(503, 0) == calls, statuses


def _post(fx: Any, session_id: Any, body: dict[str, Any]) -> int:
    try:
        response = Client(headers=fx.headers).post(
            f"/api/v1/sessions/{session_id}/calls", body, content_type="application/json"
        )
        return int(response.status_code)
    finally:
        if not connection.is_usable():
            connection.close()


def _ask(fx: Any, session_id: Any, tool_use_id: str) -> ApprovalRequest:
    body = {
        "calls": [
            {
                "id": tool_use_id,
                "name": "write_file",
                "arguments": {"path": f"{tool_use_id}.txt", "content": "x"},
            }
        ]
    }
    assert _post(fx, session_id, body) == 202
    return ApprovalRequest.objects.select_related("call").get(
        call__session_id=session_id, call__tool_use_id=tool_use_id
    )


@pytest.mark.timeout(900)
def test_a6_concurrent_writers_to_one_chain_leave_no_gap_fork_or_error(battery_db: None) -> None:
    session_id = uuid.uuid4()
    with transaction.atomic():
        record_event(kind="test.parallel", actor="writer:setup", session_id=session_id)
    errors: list[str] = []
    start = threading.Barrier(WRITERS)

    def write(writer: int) -> None:
        try:
            start.wait(30)
            for n in range(EVENTS_PER_WRITER):
                try:
                    with transaction.atomic():
                        record_event(
                            kind="test.parallel",
                            actor=f"writer:{writer}",
                            session_id=session_id,
                            payload={"writer": writer, "n": n},
                        )
                except DatabaseError as error:
                    errors.append(f"{type(error).__name__}: {error}")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(800)
    seconds = time.monotonic() - began
    rows = list(
        AuditEvent.objects.for_chain(str(session_id)).values_list("seq", "prev_hash", "hash")
    )
    expected = WRITERS * EVENTS_PER_WRITER + 1
    seqs = [seq for seq, _, _ in rows]
    gaps = len(set(range(1, expected + 1)) - set(seqs))
    prevs = [prev for _, prev, _ in rows]
    forks = len(prevs) - len(set(prevs))
    links = sum(1 for (_, _, h), (_, p, _) in zip(rows, rows[1:], strict=False) if h != p)
    report = verify_database(str(session_id))
    deadlocks = sum("deadlock" in e.lower() for e in errors)
    figures.record(
        "A6",
        f"{WRITERS} writers x {EVENTS_PER_WRITER} events: rows",
        f"{len(rows)}/{expected}",
        f"= {expected}",
        len(rows) == expected,
        seconds=round(seconds, 1),
    )
    figures.record("A6", "gaps", gaps, "0", gaps == 0)
    figures.record("A6", "forks (two events after one)", forks + links, "0", forks + links == 0)
    figures.record(
        "A6",
        "errors surfaced to writers (deadlocks)",
        f"{len(errors)} ({deadlocks})",
        "0",
        not errors,
        errors=errors[:5],
    )
    figures.record("A6", "chain verifies", report.ok, "true", report.ok)
    assert (len(rows), gaps, forks, links, errors) == (expected, 0, 0, 0, [])
    assert report.ok, report.problems
