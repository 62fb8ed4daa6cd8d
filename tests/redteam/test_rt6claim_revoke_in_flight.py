"""A worker's claim whose statement began before one OAuth token's revocation (RFC 7009,
/oauth/revoke/) committed, and that then waited on its call's row (held by a decision or a
reconciler): it read the token's sign-in (its refresh-token family) with its snapshot,
live, and ran the call after the revocation committed. The claim now holds the sign-in's
live refresh token FOR KEY SHARE as it holds the agent's row (transitions.
live_credential_sql): the revocation's lock of that row waits for a claim in flight, and
a claim that reaches it after the revocation reads it revoked and refuses the call. A
refresh racing a claim the same way is no refusal: the claim is tried once more."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from audit.models import AuditEvent
from dispatcher import execution
from dispatcher.models import Agent, Status, ToolCall
from tests.agentauth.test_token_revocation_calls import _session, _two_sign_ins
from tests.support.factories import submit_one, unique
from tests.support.oauth import DocumentServer, documents, refresh
from tests.support.row_locks import RowHold, blocked_or, require_postgresql

__all__ = ["documents"]  # the fixture

pytestmark = pytest.mark.django_db(transaction=True)


def _claim_waiting(call: ToolCall, held_row: str, meanwhile: Any) -> bool:
    """The worker's claim of `call` starts while another transaction holds `held_row` (the
    call's row, as a decision or a reconciler may, or the agent's, as a sign-out does);
    `meanwhile()` runs in a thread of its own while the claim waits; then the row is let
    go. True when `meanwhile` waited on a lock (for the claim) rather than committing."""
    if held_row == "call":
        row = ToolCall.objects.select_for_update().filter(pk=call.pk)
    else:
        row = Agent.objects.select_for_update().filter(pk=call.session.agent_id)
    with RowHold(row.exists) as hold:
        hold.waits(lambda: execution.execute_call(str(call.pk)), "the claim")
        waited = blocked_or(*hold.start(meanwhile))
    return waited


def _queued_call(documents: DocumentServer) -> tuple[str, dict[str, Any], ToolCall]:
    """(the client of an agent signed in twice; its first sign-in's answer; a call of a
    session of that sign-in, queued, reading the workspace's "secret")."""
    require_postgresql()
    client_id, agent, first, _ = _two_sign_ins(documents)
    session = _session(first["access_token"], agent)
    call = submit_one(session, "read_file", {"path": "a.txt"}, tool_use_id=unique("t"))
    assert call.status == Status.QUEUED
    return client_id, first, call


@pytest.mark.parametrize("held_row", ["call", "agent"])
def test_a_claim_in_flight_never_runs_the_call_after_its_token_was_revoked(
    documents: DocumentServer, held_row: str
) -> None:
    client_id, first, call = _queued_call(documents)

    def revoke() -> None:
        answer = Client().post(
            "/oauth/revoke/", {"token": first["access_token"], "client_id": client_id}
        )
        assert answer.status_code == 200, answer.content

    waited = _claim_waiting(call, held_row, revoke)
    call.refresh_from_db()
    kinds = list(
        AuditEvent.objects.filter(subject=f"call:{call.pk}").values_list("kind", flat=True)
    )
    if call.status == Status.COMPLETED:  # (its claim committed before the revocation wrote)
        # Was: the revocation committed while the claim waited, then the call ran.
        assert waited, "the call ran after its token's revocation committed"
        return
    assert (call.status, call.decided_by) == (Status.DENIED, "guard:token"), call.content
    assert "call.started" not in kinds and "secret" not in call.content, kinds


@pytest.mark.parametrize("held_row", ["call", "agent"])
def test_a_refresh_while_a_claim_waits_does_not_deny_the_call(
    documents: DocumentServer, held_row: str
) -> None:
    client_id, first, call = _queued_call(documents)

    def renew() -> None:
        answer = refresh(client_id, first["refresh_token"])
        assert answer.status_code == 200, answer.content

    _claim_waiting(call, held_row, renew)
    call.refresh_from_db()
    assert call.status == Status.COMPLETED and "secret" in call.content, call.content
