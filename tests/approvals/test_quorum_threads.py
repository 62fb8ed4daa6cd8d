"""The last missing approval cast by two reviewers at once, in real threads with their
own database connections (transaction=True): one approval, one message to a worker."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from approvals import services
from approvals.models import ApprovalRequest, Vote
from audit.models import AuditEvent
from dispatcher.models import Status, ToolCall
from dispatcher.policy import profiles
from tests.approvals.conftest import ask, closing_connections
from tests.support.factories import make_agent, make_user, unique

pytestmark = pytest.mark.django_db(transaction=True)


def test_racing_last_votes_give_one_approval_and_one_dispatch() -> None:
    fx = make_agent(mode="standard")
    profiles.update_profile(
        user=fx.owner,
        mode="standard",
        allow=[],
        ask=[{"rule": "write_file", "approvals": 2}],
        deny=[],
        actor="test",
    )
    people = [make_user(unique("rev"), groups=("reviewer",)) for _ in range(4)]
    for round_ in range(5):
        approval = ask(fx, {"path": f"t{round_}.txt", "content": "x"}, call_id=f"t{round_}")
        services.decide(
            approval_id=approval.pk, user=people[0], approve=True, digest=approval.call.digest
        )
        barrier = threading.Barrier(3)

        def vote(
            person: object,
            approval: ApprovalRequest = approval,
            barrier: threading.Barrier = barrier,
        ) -> str:
            barrier.wait(10)
            try:
                services.decide(
                    approval_id=approval.pk,
                    user=person,  # type: ignore[arg-type]
                    approve=True,
                    digest=approval.call.digest,
                )
            except services.DecisionRefused as refused:
                return f"{refused.status}"
            return "ok"

        with ThreadPoolExecutor(3) as pool:
            answers = sorted(pool.map(lambda p: closing_connections(lambda: vote(p))(), people[1:]))
        assert answers == ["409", "409", "ok"], answers
        call = ToolCall.objects.get(pk=approval.call_id)
        assert call.status == Status.QUEUED and call.enqueued_at is not None
        assert Vote.objects.filter(approval=approval).count() == 2
        assert (
            AuditEvent.objects.filter(subject=f"call:{call.pk}", kind="call.approved").count() == 1
        )
