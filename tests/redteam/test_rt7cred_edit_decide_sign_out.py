"""A reviewer's edit and another reviewer's approval of one signed-in agent's call, and
the owner's sign-out, at once, while something else holds the agent's row FOR NO KEY
UPDATE (a session starting, another edit: agents._lock_for_a_session, read_sign_in).

A decision takes the agent's row FOR KEY SHARE before the approval's row (credfix:
approvals.services._agent_held). An edit took the approval's row first, then the agent's
FOR NO KEY UPDATE: held off by the other holder, it queued for the row behind the
sign-out (waiting for its FOR UPDATE), which waited for the decision's share lock, which
waited for the approval's row the edit held. PostgreSQL ended one of them ("deadlock
detected": the sign-out, the edit or the approval a 500; seen in
tests/agentauth/test_sign_out_lock_order.py). The edit now takes the agent's row with
the approval's, as a decision does."""

from __future__ import annotations

from typing import Any

import pytest

from agentauth import services
from approvals import services as approvals
from dispatcher.models import Agent, Status
from tests.agentauth.test_sign_out_lock_order import _signed_in_with_asks
from tests.support.oauth import DocumentServer, documents
from tests.support.row_locks import RowHold, require_postgresql

__all__ = ["documents"]  # the fixture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]


def test_an_edit_an_approval_and_a_sign_out_of_one_agent_at_once_end_without_a_deadlock(
    documents: DocumentServer,
) -> None:
    require_postgresql()
    owner, agent, reviewer, asks = _signed_in_with_asks(documents)
    ask = asks[0]
    refused: list[Any] = []

    def edit() -> None:
        try:
            approvals.edit(
                approval_id=ask.pk,
                user=reviewer,
                digest=ask.call.digest,
                arguments={**ask.call.arguments, "content": "edited"},
            )
        except approvals.DecisionRefused as why:
            refused.append(why)

    def decide() -> None:
        try:
            approvals.decide(
                approval_id=ask.pk, user=reviewer, approve=True, digest=ask.call.digest
            )
        except approvals.DecisionRefused as why:
            refused.append(why)

    # The agent's row held FOR NO KEY UPDATE meanwhile, as a session's start holds it.
    # Was: "deadlock detected" in the sign-out, the edit or the approval (a failure of a
    # thread).
    session_start = Agent.objects.select_for_update(no_key=True).filter(pk=agent.pk)
    with RowHold(session_start.exists) as hold:
        for work, what in (
            (lambda: services.sign_out_agent(agent=agent, actor="test"), "the sign-out"),
            (edit, "the edit"),
            (decide, "the approval"),
        ):
            hold.waits(work, what)
    assert all(why.status == 409 for why in refused), refused
    ask.call.refresh_from_db()
    assert ask.call.status != Status.PENDING_APPROVAL
    assert not agent.oauth_tokens.exists()  # signed out
