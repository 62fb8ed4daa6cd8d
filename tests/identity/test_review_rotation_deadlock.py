"""Review of the voided/rotated tokens' queued calls: a rotation records its event, then
denies the agent's queued calls one by one (each a row update, then its session chain's
lock); a worker's claim updates its call's row, then takes the same session chain's lock.
Two queued calls of one session, the worker claiming the second while the rotation
denies the first: each waits for what the other holds."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from dispatcher import agents
from dispatcher.models import Status
from tests.support.factories import make_user, submit_one, unique


@pytest.mark.skipif(connections["default"].vendor != "postgresql", reason="row locks: PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_a_rotation_and_a_workers_claim_of_the_same_sessions_calls_do_not_deadlock() -> None:
    owner = make_user(unique("olga"), groups=("admin",), mode="trusted")
    agent, _ = agents.create_agent(owner=owner, name=unique("agent"), actor="t", shown_to=owner)
    session = agents.start_session(agent=agent)
    first = submit_one(session, "write_file", {"path": "a.txt", "content": "x"}, "w1")
    second = submit_one(session, "write_file", {"path": "b.txt", "content": "x"}, "w2")
    assert first.status == second.status == Status.QUEUED
    errors: list[BaseException] = []

    def rotate() -> None:
        try:
            agents.rotate_token(agent=agent, actor="user:root", shown_to=owner)
        except BaseException as error:  # noqa: BLE001 (the test reads it)
            errors.append(RuntimeError(f"the rotation failed: {error}"))
        finally:
            connections.close_all()

    worker = connections.create_connection("default")
    worker.set_autocommit(False)
    with worker.cursor() as cursor:
        # What transitions.claim does: the conditional update of its call, then the
        # session chain's lock (record_event), in one transaction.
        cursor.execute(
            "UPDATE dispatcher_toolcall SET status = 'running' WHERE id = %s AND status = %s",
            [second.pk, Status.QUEUED],
        )
        rotation = threading.Thread(target=rotate)
        rotation.start()
        # the rotation denies the first call (its session chain locked) and skips the
        # second's row, locked here (agents._deny_queued): wait until it ends, or waits
        # on a lock (events: the thread's end, its backend waiting), then take the chain
        for _ in range(200):
            # (read anew: in a transaction, pg_stat_activity is what its first read saw)
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0]:
                break
            rotation.join(0.05)
            if not rotation.is_alive():
                break
        try:
            cursor.execute(
                "SELECT 1 FROM audit_auditchain WHERE chain = %s FOR UPDATE",
                [str(session.pk)],
            )
            worker.commit()
        except Exception as error:  # the worker's claim was the one PostgreSQL killed
            worker.rollback()
            errors.append(RuntimeError(f"the worker's claim failed: {error}"))
    rotation.join(30)
    worker.close()
    assert not errors, errors
