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

from pathlib import Path

import pytest
from django.db import transaction

from audit.models import AuditEvent
from dispatcher import execution
from dispatcher.models import Status, ToolCall
from tests.agentauth.test_sign_out_claim_race import _bearer_session, _signed_in_session
from tests.support.factories import submit_one, unique
from tests.support.oauth import documents
from tests.support.row_locks import RowHold, blocked_or, require_postgresql

__all__ = ["documents"]  # the fixture

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("kill", ["sign_out", "revoke", "rotate", "move"])
def test_a_claim_waiting_on_its_row_never_runs_the_call_after_the_sign_out(
    kill: str, request: pytest.FixtureRequest
) -> None:
    require_postgresql()
    session, die = _signed_in_session(request) if kill == "sign_out" else _bearer_session(kill)
    (Path(session.workspace) / "a.txt").write_text("secret")
    call = submit_one(session, "read_file", {"path": "a.txt"}, tool_use_id=unique("t"))
    assert call.status == Status.QUEUED
    # Another transaction holds the call's row (as a decision or a reconciler may).
    with RowHold(lambda: ToolCall.objects.select_for_update().filter(pk=call.pk).exists()) as hold:
        hold.waits(lambda: execution.execute_call(str(call.pk)), "the claim")
        # Was: the sign-out committed here, the claim still waiting.
        waited = blocked_or(*hold.start(lambda: transaction.atomic(die)()))
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
