"""Red team of the left sessions (AgentSession.left_at): a move of an agent an admin made
(transfer_agent cancels its asks) at the same moment as reviewers' approvals of those
asks, on PostgreSQL: none may end in a 500, and no ask of the left session may run. The
move cancelled the asks one by one: it held the session's audit chain (the first cancel)
while it waited for the row of a call an approval held, which waited for that chain
(deadlock detected, the approval a 500, in about every run of this test)."""

from __future__ import annotations

import random
import threading
import traceback
from typing import Any

import pytest
from django.db import connection, connections

from approvals import services as approvals
from approvals.models import ApprovalRequest, Decision
from dispatcher import agents
from dispatcher.models import Status, ToolCall
from tests.support.factories import submit_one
from tests.teams.world import make_team

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_move_and_approvals_of_its_asks_at_once_wait_for_each_other() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    failures: list[str] = []
    rounds = []
    for _ in range(6):
        pay, away = make_team("pay"), make_team("away")
        asks = [
            ApprovalRequest.objects.get(
                call=submit_one(
                    pay.session, "write_file", {"path": f"r{i}.txt", "content": "x"}, f"r{i}"
                )
            )
            for i in range(4)
        ]
        rounds.append((pay, away, asks))

    def run(job: Any) -> None:
        try:
            job()
        except approvals.DecisionRefused:
            pass
        except Exception:  # noqa: BLE001 (what a request would answer 500 with)
            failures.append(traceback.format_exc()[-1500:])
        finally:
            connections.close_all()

    jobs: list[Any] = []
    for pay, away, asks in rounds:
        jobs.append(
            lambda p=pay, a=away: agents.transfer_agent(
                agent=type(p.agent.agent).objects.get(pk=p.agent.agent.pk),
                team=a.team,
                actor="test",
            )
        )
        reviewer = pay.members["reviewer"]
        for ask in asks:
            jobs.append(
                lambda r=reviewer, k=ask: approvals.decide(
                    approval_id=k.pk, user=r, approve=True, digest=k.call.digest
                )
            )
    random.shuffle(jobs)
    threads = [threading.Thread(target=run, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, "\n=====\n".join(failures)
    for _, _, asks in rounds:
        for ask in asks:
            call = ToolCall.objects.get(pk=ask.call_id)
            if call.status in (Status.CANCELLED, Status.DENIED):
                continue
            # An approval that committed before the move released its call, and a worker
            # (this run's live stack's, serving the same queue) claimed it before the
            # move's sweep: it ran as any approved call a moment earlier would have
            # (`_deny_queued` leaves a row being claimed to its claim). Never a call the
            # move cancelled or denied, and never without its approval.
            ask.refresh_from_db()
            assert ask.decision == Decision.APPROVED, (call.status, ask.decision)
            assert call.status in (Status.QUEUED, Status.RUNNING, Status.COMPLETED), call.status
