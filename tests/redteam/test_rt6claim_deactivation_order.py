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

import pytest
from django.contrib.auth.models import Group
from django.db import transaction
from django.test import Client

from audit import roles
from audit.models import AuditChain, AuditEvent
from dispatcher import execution
from dispatcher.models import Status, ToolCall
from tests.approvals.conftest import ask
from tests.approvals.test_quorum import WRITE, quorum_agent, vote
from tests.support.row_locks import RowHold, require_postgresql

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_deactivation_and_a_claim_in_a_session_voted_in_do_not_deadlock() -> None:
    require_postgresql()
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
    # Was: psycopg.errors.DeadlockDetected in the deactivation (rolled back: still active),
    # a failure of its thread.
    head = AuditChain.objects.select_for_update().filter(chain=session_id)
    with RowHold(head.exists) as hold:
        hold.waits(
            lambda: transaction.atomic(roles.deactivate)(user=leaver, actor="admin"),
            "the deactivation",
        )
        hold.waits(lambda: execution.execute_call(str(call.pk)), "the claim")
    leaver.refresh_from_db()
    assert not leaver.is_active
    call.refresh_from_db()
    kinds = list(
        AuditEvent.objects.filter(subject=f"call:{call.pk}").values_list("kind", flat=True)
    )
    assert call.status != Status.QUEUED, call.status  # ended, either way
    if call.status == Status.DENIED:
        assert "call.started" not in kinds
