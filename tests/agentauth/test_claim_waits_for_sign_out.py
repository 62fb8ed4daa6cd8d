"""A worker's claim whose statement began before a sign-out (a revocation, a rotation)
committed, and that then waited on a row lock (its call's row, held by another
transaction) while the sign-out committed: the claim read the credential with its
statement's snapshot, live, and ran the call after the sign-out, whose sweep skipped the
locked row. The audit log said the agent was signed out, then the call started.

The claim now holds the agent's row FOR KEY SHARE from its condition to its commit, and
each step that kills the credential takes that row FOR UPDATE first
(transitions.live_credential_sql): the sign-out waits for the claim in flight, so the
call starts before the sign-out, never after it (a move to another team too)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections, transaction

from audit.models import AuditEvent
from dispatcher import execution
from dispatcher.models import Status, ToolCall
from tests.agentauth.test_sign_out_claim_race import _bearer_session, _signed_in_session
from tests.support.factories import submit_one, unique
from tests.support.oauth import documents

__all__ = ["documents"]  # the fixture

pytestmark = pytest.mark.django_db(transaction=True)


def _pid() -> int:
    connection.ensure_connection()
    return int(connection.connection.info.backend_pid)


def _blocked_or(pid_box: list[int], done: threading.Event) -> bool:
    """Wait until the backend in `pid_box` waits on a lock (True) or `done` is set (False)."""
    with connections["default"].cursor() as cursor:
        for _ in range(6000):
            if done.is_set():
                return False
            if pid_box:
                cursor.execute("SELECT cardinality(pg_blocking_pids(%s))", [pid_box[0]])
                if cursor.fetchone()[0]:
                    return True
            done.wait(0.01)
    raise AssertionError("neither blocked nor done")


def _in_thread(work: Callable[[], Any], pid_box: list[int], done: threading.Event) -> Any:
    failures: list[BaseException] = []

    def run() -> None:
        try:
            pid_box.append(_pid())
            work()
        except BaseException as error:  # noqa: BLE001 - reported by the caller
            failures.append(error)
        finally:
            done.set()
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, failures


@pytest.mark.parametrize("kill", ["sign_out", "revoke", "rotate", "move"])
def test_a_claim_waiting_on_its_row_never_runs_the_call_after_the_sign_out(
    kill: str, request: pytest.FixtureRequest
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks across connections: PostgreSQL (SQLite has one writer)")
    session, die = _signed_in_session(request) if kill == "sign_out" else _bearer_session(kill)
    (Path(session.workspace) / "a.txt").write_text("secret")
    call = submit_one(session, "read_file", {"path": "a.txt"}, tool_use_id=unique("t"))
    assert call.status == Status.QUEUED
    # Another transaction holds the call's row (as a decision or a reconciler may).
    held, release = threading.Event(), threading.Event()

    def hold_row() -> None:
        with transaction.atomic():
            ToolCall.objects.select_for_update().filter(pk=call.pk).exists()
            held.set()
            assert release.wait(60)

    holder_pid: list[int] = []
    holder, holder_failed = _in_thread(hold_row, holder_pid, threading.Event())
    claimer_pid: list[int] = []
    claimed = threading.Event()
    claimer = killer = None
    try:
        assert held.wait(30)
        claimer, claim_failed = _in_thread(
            lambda: execution.execute_call(str(call.pk)), claimer_pid, claimed
        )
        assert _blocked_or(claimer_pid, claimed), "the claim did not wait on the row"
        killer_pid: list[int] = []
        killed = threading.Event()
        killer, kill_failed = _in_thread(lambda: transaction.atomic(die)(), killer_pid, killed)
        # Was: the sign-out committed here, the claim still waiting.
        waited = _blocked_or(killer_pid, killed)
    finally:
        release.set()
        holder.join(60)
        if claimer is not None:
            claimer.join(60)
        if killer is not None:
            killer.join(60)
    assert not holder_failed and not claim_failed and not kill_failed
    call.refresh_from_db()
    kinds = dict(AuditEvent.objects.filter(subject=f"call:{call.pk}").values_list("kind", "id"))
    killed_at = (
        AuditEvent.objects.filter(subject=f"agent:{session.agent_id}")
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    assert killed_at is not None
    if call.status == Status.DENIED:  # (the kill came first: it may, it is not run then)
        assert "call.started" not in kinds and "secret" not in call.content
        return
    # The call ran: its claim committed before the kill wrote anything (the kill waited).
    # Was: the kill's event, then call.started (the sign-out committed, then the call ran).
    assert call.status == Status.COMPLETED, call.content
    assert kinds["call.started"] < killed_at, (kinds, killed_at)
    assert waited, "the kill committed while the claim waited"
