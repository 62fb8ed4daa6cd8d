"""A deactivation voided the leaver's votes first (writing to the audit chains of the
sessions voted in) and locked the agents it revokes only after; a worker's claim of a
call of one of those agents, in one of those sessions, holds the agent's row FOR KEY
SHARE (transitions.live_credential_sql) and then writes to that chain. The two waited on
each other and PostgreSQL aborted the deactivation with a deadlock (the admin saw an
error, the person stayed active). The deactivation now locks the leaver's agents first
(dispatcher.agents.lock_agents_of, its first step), in the order every killing step
takes: it waits for the claim in flight, or the claim waits for it and refuses the call."""

from __future__ import annotations

import json
import threading

import pytest
from django.contrib.auth.models import Group
from django.db import connection, transaction
from django.test import Client

from audit import roles
from audit.models import AuditChain, AuditEvent
from dispatcher import execution
from dispatcher.models import Status, ToolCall
from tests.agentauth.test_claim_waits_for_sign_out import _blocked_or, _in_thread
from tests.approvals.conftest import ask
from tests.approvals.test_quorum import WRITE, quorum_agent, vote

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_deactivation_and_a_claim_in_a_session_voted_in_do_not_deadlock() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks across connections: PostgreSQL")
    fx = quorum_agent(approvals=2)
    leaver = fx.owner
    leaver.groups.add(Group.objects.get_or_create(name="reviewer")[0])
    approval = ask(fx, WRITE)
    session_id = str(approval.call.session_id)
    browser = Client()
    browser.force_login(leaver)
    assert vote(browser, approval).status_code == 200
    body = {"calls": [{"id": "r1", "name": "read_file", "arguments": {"path": "a.txt"}}]}
    sent = Client().post(
        f"/api/v1/sessions/{session_id}/calls",
        data=json.dumps(body),
        content_type="application/json",
        headers=fx.headers,
    )
    assert sent.status_code in (200, 202), sent.content
    call = ToolCall.objects.get(session_id=session_id, name="read_file")
    assert call.status == Status.QUEUED, call.status
    # Another transaction holds the session chain's head (an event being written).
    held, release = threading.Event(), threading.Event()

    def hold_head() -> None:
        with transaction.atomic():
            AuditChain.objects.select_for_update().filter(chain=session_id).exists()
            held.set()
            assert release.wait(60)

    holder, holder_failed = _in_thread(hold_head, [], threading.Event())
    threads = []
    try:
        assert held.wait(30)
        gone_pid: list[int] = []
        gone = threading.Event()
        threads.append(
            _in_thread(
                lambda: transaction.atomic(roles.deactivate)(user=leaver, actor="admin"),
                gone_pid,
                gone,
            )
        )
        assert _blocked_or(gone_pid, gone), "the deactivation did not wait"
        claim_pid: list[int] = []
        claimed = threading.Event()
        threads.append(_in_thread(lambda: execution.execute_call(str(call.pk)), claim_pid, claimed))
        assert _blocked_or(claim_pid, claimed), "the claim did not wait"
    finally:
        release.set()
        holder.join(60)
        for thread, _ in threads:
            thread.join(60)
    assert not holder_failed
    (_, deactivation_failed), (_, claim_failed) = threads
    # Was: psycopg.errors.DeadlockDetected in the deactivation (rolled back: still active).
    assert not deactivation_failed, deactivation_failed
    assert not claim_failed, claim_failed
    leaver.refresh_from_db()
    assert not leaver.is_active
    call.refresh_from_db()
    kinds = list(
        AuditEvent.objects.filter(subject=f"call:{call.pk}").values_list("kind", flat=True)
    )
    assert call.status != Status.QUEUED, call.status  # ended, either way
    if call.status == Status.DENIED:
        assert "call.started" not in kinds
