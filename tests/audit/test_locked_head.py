"""A transition's write and its chain head's lock in one statement (PostgreSQL): the head
comes back as the ORM reads it, is locked only when the write wrote, and is locked after
the write, in the order the two statements took them (no lock-order inversion)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction

from audit.models import AuditChain, AuditEvent
from audit.services import EventSpec, record_events, write_and_lock_head
from audit.verify import verify_database
from dispatcher import agents, transitions
from dispatcher.models import Status, ToolCall
from tests.support.factories import make_agent, submit_one


def pending_call() -> ToolCall:
    session = agents.start_session(agent=make_agent(mode="standard").agent)
    call = submit_one(session, "write_file", {"path": "f.txt", "content": "x"})
    assert call.status == Status.PENDING_APPROVAL
    return call


def deny_statement(call: ToolCall, previous: str = Status.PENDING_APPROVAL) -> tuple[str, Any]:
    statement = transitions._update_statement(call.pk, previous, {"status": Status.DENIED})
    assert statement is not None
    return statement


def other_connection() -> psycopg.Connection[Any]:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True)


def columns(head: AuditChain) -> dict[str, Any]:
    return {f.attname: getattr(head, f.attname) for f in AuditChain._meta.concrete_fields}


@pytest.mark.django_db
def test_the_head_comes_back_as_the_orm_reads_it() -> None:
    call = pending_call()
    with transaction.atomic():
        written, head = write_and_lock_head(*deny_statement(call), session_id=call.session_id)
        assert written == 1
        if connection.vendor != "postgresql":
            assert head is None  # (SQLite: the statement alone; record_events locks)
            return
        assert head is not None
        assert columns(head) == columns(AuditChain.objects.get(chain=str(call.session_id)))
        assert not head._state.adding
    assert ToolCall.objects.get(pk=call.pk).status == Status.DENIED


@pytest.mark.django_db
def test_a_write_that_matched_nothing_returns_no_head() -> None:
    call = pending_call()
    with transaction.atomic():
        written, head = write_and_lock_head(
            *deny_statement(call, previous=Status.QUEUED), session_id=call.session_id
        )
    assert (written, head) == (0, None)
    assert ToolCall.objects.get(pk=call.pk).status == Status.PENDING_APPROVAL


@pytest.mark.django_db(transaction=True)
def test_it_refuses_to_run_outside_a_transaction() -> None:
    call = pending_call()
    with pytest.raises(transaction.TransactionManagementError):
        write_and_lock_head(*deny_statement(call), session_id=call.session_id)
    assert ToolCall.objects.get(pk=call.pk).status == Status.PENDING_APPROVAL


@pytest.mark.django_db
def test_a_head_of_another_chain_is_refused() -> None:
    call, other = pending_call(), pending_call()
    with pytest.raises(ValueError, match="another chain"), transaction.atomic():
        head = AuditChain.objects.select_for_update().get(chain=str(other.session_id))
        record_events(
            [EventSpec("call.denied", "test", f"call:{call.pk}")],
            session_id=call.session_id,
            locked_head=head,
        )


@pytest.mark.django_db
def test_a_chain_without_a_head_is_locked_by_the_append() -> None:
    call = pending_call()
    chain = uuid.uuid4()  # events of this write go to a chain that has no event yet
    with transaction.atomic():
        written, head = write_and_lock_head(*deny_statement(call), session_id=chain)
        assert (written, head) == (1, None)
        [event] = record_events(
            [EventSpec("call.denied", "test", f"call:{call.pk}")],
            session_id=chain,
            locked_head=head,
        )
    assert event.seq == 1
    assert verify_database(str(chain)).ok


@pytest.mark.django_db(transaction=True)
def test_the_write_comes_before_the_head_lock_and_a_miss_locks_nothing() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("one statement on PostgreSQL only; SQLite serializes all writers")
    call = pending_call()
    chain = str(call.session_id)
    lock_head = 'SELECT 1 FROM "audit_auditchain" WHERE "chain" = %s FOR UPDATE'
    lock_call = 'SELECT 1 FROM "dispatcher_toolcall" WHERE "id" = %s FOR UPDATE NOWAIT'
    with other_connection() as holder, other_connection() as prober:
        # A miss locks no head: another transaction takes the head at once.
        with transaction.atomic():
            miss = write_and_lock_head(
                *deny_statement(call, previous=Status.QUEUED), session_id=chain
            )
            assert miss == (0, None)
            with prober.transaction():
                prober.execute(lock_head + " NOWAIT", [chain])
        # The head held elsewhere: the statement writes the call, then waits for the head.
        result: list[tuple[int, AuditChain | None]] = []
        with holder.transaction():
            holder.execute(lock_head, [chain])

            def transition() -> None:
                try:
                    with transaction.atomic():
                        result.append(write_and_lock_head(*deny_statement(call), session_id=chain))
                finally:
                    connection.close()

            thread = threading.Thread(target=transition)
            thread.start()
            deadline = time.monotonic() + 10
            while True:  # until the call's row is held by the waiting statement
                try:
                    with prober.transaction():
                        prober.execute(lock_call, [call.pk])
                except psycopg.errors.LockNotAvailable:
                    break
                assert time.monotonic() < deadline, "the call was not written while waiting"
                time.sleep(0.02)
            assert thread.is_alive() and not result  # still waiting for the head
        thread.join(10)
    [(written, head)] = result
    assert written == 1 and head is not None and head.chain == chain
    assert ToolCall.objects.get(pk=call.pk).status == Status.DENIED
    assert AuditEvent.objects.filter(chain=chain).count() == head.last_seq
