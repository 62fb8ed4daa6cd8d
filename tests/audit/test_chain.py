"""Hash chains: each event links to the one before; parallel appends leave no gaps."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction

from audit.models import AuditChain, AuditEvent
from audit.services import GENESIS_HASH, EventSpec, record_event, record_events
from audit.verify import verify_database
from tests.audit.chains import write_chain


@pytest.mark.django_db
def test_each_event_links_to_the_one_before() -> None:
    events = write_chain(5)
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert events[0].prev_hash == GENESIS_HASH
    assert all(b.prev_hash == a.hash for a, b in zip(events, events[1:], strict=False))
    assert verify_database(events[0].chain).ok


@pytest.mark.django_db
def test_the_head_and_summary_follow_the_last_event() -> None:
    events = write_chain(4)
    head = AuditChain.objects.get(chain=events[0].chain)
    assert (head.last_seq, head.last_hash, head.last_event_id) == (
        4,
        events[-1].hash,
        events[-1].pk,
    )
    assert (head.agent, head.owner, head.calls, head.tools) == ("test", "tester", 3, " read_file ")


@pytest.mark.django_db
def test_times_never_go_backwards_along_a_chain() -> None:
    """An event timed before another process's append won the chain lock is stored at the
    time of the event before it, never earlier; several events append as one."""
    events = write_chain(2)
    chain = events[0].chain
    earlier = events[-1].created_at - timedelta(hours=1)
    with transaction.atomic():
        late = record_events(
            [
                EventSpec("call.received", "agent:test", "call:x", {"call_id": "x"}, earlier),
                EventSpec("call.allowed", "mode:trusted", "call:x", {"call_id": "x"}),
            ],
            session_id=chain,
        )
    assert [e.seq for e in late] == [3, 4]
    assert late[0].created_at == events[-1].created_at
    assert late[0].created_at <= late[1].created_at
    stored = list(AuditEvent.objects.filter(chain=chain).order_by("seq"))
    assert all(a.created_at <= b.created_at for a, b in zip(stored, stored[1:], strict=False))
    assert AuditChain.objects.get(chain=chain).last_seq == 4
    assert verify_database(chain).ok


@pytest.mark.django_db
def test_record_event_refuses_to_run_outside_a_transaction() -> None:
    with pytest.raises(transaction.TransactionManagementError):
        # The db fixture wraps the test in a transaction; leave it to reach autocommit.
        connection.in_atomic_block = False
        try:
            record_event(kind="test", actor="test")
        finally:
            connection.in_atomic_block = True


@pytest.mark.django_db(transaction=True)
def test_parallel_writers_append_to_one_chain_without_gaps_or_duplicates() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the advisory-lock path is PostgreSQL's; SQLite serializes all writers")
    session_id = uuid.uuid4()
    writers, per_writer = 8, 25
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            barrier.wait()
            for i in range(per_writer):
                with transaction.atomic():
                    record_event(
                        kind="test.parallel",
                        actor=f"writer:{n}",
                        session_id=session_id,
                        payload={"writer": n, "i": i},
                    )
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    seqs = list(AuditEvent.objects.filter(chain=str(session_id)).values_list("seq", flat=True))
    assert sorted(seqs) == list(range(1, writers * per_writer + 1))
    report = verify_database(str(session_id))
    assert report.ok, report.problems
    assert AuditChain.objects.get(chain=str(session_id)).last_seq == writers * per_writer


@pytest.mark.django_db
def test_an_unregistered_kind_is_refused_and_nothing_is_written() -> None:
    from audit.kinds import UnknownKind

    before = AuditEvent.objects.count()
    with transaction.atomic(), pytest.raises(UnknownKind, match="call.recieved"):
        record_event(kind="call.recieved", actor="test")
    assert AuditEvent.objects.count() == before
