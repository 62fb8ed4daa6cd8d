"""Red-team of the reviewer side of approvals: what a reviewer approves is exactly what
runs, approved by whom the rules require, and only once. Each test is an attack through
the real views (Django test client, real PostgreSQL); it passes when the attack fails.

Found and fixed with these tests:
- Under separation of duties (HARNESS_FORBID_SELF_APPROVAL) a quorum counted an earlier
  vote of a reviewer who had since become one of the people behind the agent (it was
  handed over to them, or they became its sponsor): the owner's own vote approved their
  agent's call. Such a vote is now discarded when the quorum is counted, as a leaver's is
  (services._departure).
"""

from __future__ import annotations

import pytest
from django.test import override_settings

from approvals.models import Vote
from audit.models import AuditEvent
from dispatcher import agents
from tests.approvals.conftest import ask
from tests.approvals.test_quorum import WRITE, quorum_agent, reviewer, status_of, vote

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("becomes", ["owner", "sponsor"])
@override_settings(HARNESS_FORBID_SELF_APPROVAL=True)
def test_a_vote_of_someone_who_since_stands_behind_the_agent_does_not_count(
    becomes: str,
) -> None:
    fx = quorum_agent(approvals=2)
    approval = ask(fx, WRITE)
    first, first_client = reviewer()
    _, second_client = reviewer()
    assert vote(first_client, approval).status_code == 200
    if becomes == "owner":  # e.g. the owner left and the agent went to this reviewer
        agents.hand_over_agent(agent=fx.agent, to=first, actor="test")
    else:
        agents.transfer_agent(agent=fx.agent, sponsor=first, actor="test")

    answer = vote(second_client, approval)

    assert answer.status_code == 200, answer.content
    assert "counts: 1 of 2" in answer.content.decode()
    assert status_of(approval) == "pending_approval"
    assert not Vote.objects.filter(approval=approval, voter=first).exists()
    discarded = AuditEvent.objects.get(
        subject=f"call:{approval.call_id}", kind="approval.vote_discarded"
    )
    assert discarded.payload["reviewer"] == first.username
    assert discarded.payload["reason"] == f"they are now this agent's {becomes}"
    # ... and they cannot vote again either: a third, independent reviewer completes it.
    assert vote(first_client, approval).status_code == 403
    _, third_client = reviewer()
    assert vote(third_client, approval).status_code == 200
    assert status_of(approval) == "queued"
