"""A reviewer's edit of a bearer agent's call (the edit approves what it wrote) and the
agent's move to another team at once.

The approval's release now holds the agent's row FOR KEY SHARE (transitions.
_release_approved, `hold`). A decision takes that row first, before the approval's
(approvals.services._agent_held); an edit of a bearer agent's call took it last: the
approval's row, the call's (the edit's own transition), its session's audit chain, then,
releasing the replacement it approves, the agent's row. A move locks the agent's row FOR
UPDATE, then cancels the agent's calls waiting for a reviewer (agents._cancel_waiting,
their rows locked): each held what the other waited for, and PostgreSQL ended one of
them ("deadlock detected": the reviewer's edit a 500, or the move)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from approvals import services as approval_services
from approvals.models import ApprovalRequest
from audit.models import GLOBAL_CHAIN, AuditChain
from dispatcher import agents
from dispatcher.models import Agent, Status, ToolCall
from tests.support.factories import make_user, unique
from tests.support.row_locks import RowHold, require_postgresql, wait_blocked_by
from tests.teams.world import make_team

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]


def test_an_edit_and_a_move_of_its_agent_at_once_wait_for_each_other() -> None:
    require_postgresql()
    pay, away = make_team("pay"), make_team("away")
    agent, call = pay.agent.agent, pay.approval.call
    assert call.status == Status.PENDING_APPROVAL
    reviewer = make_user(unique("rita"), groups=("reviewer",))
    assert AuditChain.objects.filter(chain=GLOBAL_CHAIN).exists()

    def move() -> None:
        with transaction.atomic():
            moving = Agent.objects.get(pk=agent.pk)
            assert agents.transfer_agent(agent=moving, team=away.team, actor="test")

    outcome: dict[str, Any] = {}

    def edit() -> None:
        try:
            outcome["edit"] = approval_services.edit(
                approval_id=pay.approval.pk,
                user=reviewer,
                digest=call.digest,
                arguments={"path": call.arguments["path"], "content": "edited"},
            )
        except approval_services.DecisionRefused as refused:
            outcome["refused"] = refused

    # The move, past the agent's row, waits for the global chain held meanwhile.
    # Was: "deadlock detected", raised by the edit or the move (a failure of a thread).
    global_chain = AuditChain.objects.select_for_update().filter(chain=GLOBAL_CHAIN)
    with RowHold(global_chain.exists) as hold:
        pid = hold.waits(move, "the move")
        _, edited = hold.start(edit)
        wait_blocked_by(pid[0], edited)  # the edit waits for the move's agent row
    # The move came first: the call it cancelled is not edited (409).
    assert "refused" in outcome, outcome
    assert outcome["refused"].status == 409, outcome["refused"]
    call.refresh_from_db()
    assert call.status == Status.CANCELLED, call.status
    assert not ToolCall.objects.filter(edited_from=call).exists()
    assert not ApprovalRequest.objects.filter(call__edited_from=call).exists()
