"""Red-team of the reviewer side of approvals: what a reviewer approves is exactly what
runs, approved by whom the rules require, and only once. Each test is an attack through
the real views (Django test client, real PostgreSQL); it passes when the attack fails.

Found and fixed with these tests:
- Under separation of duties (HARNESS_FORBID_SELF_APPROVAL) a quorum counted an earlier
  vote of a reviewer who had since become one of the people behind the agent (it was
  handed over to them, or they became its sponsor): the owner's own vote approved their
  agent's call. Such a vote is now discarded when the quorum is counted, as a leaver's is
  (services._departure).
- A one-tap link confirmed with an effect digest other than the previewed one was refused,
  but its audit event (approval.digest_mismatch) was rolled back with the link's
  transaction, where the queue keeps it (links.use).
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

from approvals import links
from approvals.models import UsedLink, Vote
from audit.models import AuditEvent
from dispatcher import agents
from tests.approvals.conftest import ask
from tests.approvals.test_preview_approval import _ask_script, previews_on  # noqa: F401
from tests.approvals.test_quorum import WRITE, quorum_agent, reviewer, status_of, vote
from tests.support.factories import AgentFixture

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


def _path(url: str) -> str:
    return "/" + url.split("/", 3)[3]


@pytest.mark.usefixtures("previews_on")
def test_a_link_confirmed_for_another_effect_is_refused_and_audited_as_the_queue_does(
    agent: AgentFixture, reviewer: User
) -> None:
    approval = _ask_script(agent)
    assert approval.effect_digest
    client = Client()
    client.force_login(reviewer)
    link = _path(links.make_url(approval, reviewer, "approve"))
    other_effect = "0" * 64

    refused = client.post(link, {"digest": approval.call.digest, "effect_digest": other_effect})

    assert refused.status_code == 409 and "effect digest mismatch" in refused.content.decode()
    assert status_of(approval) == "pending_approval"
    mismatch = AuditEvent.objects.get(
        subject=f"call:{approval.call_id}", kind="approval.digest_mismatch"
    )
    assert mismatch.actor == f"user:{reviewer.username}"
    assert mismatch.payload["effect_digest_seen"] == other_effect
    # Nothing was decided, so the link is still unused: confirmed with the effect shown,
    # it decides, once.
    assert not UsedLink.objects.filter(approval=approval).exists()
    done = client.post(
        link, {"digest": approval.call.digest, "effect_digest": approval.effect_digest}
    )
    assert done.status_code == 200 and "Approved run_command." in done.content.decode()
    assert status_of(approval) == "queued"
    again = client.post(
        link, {"digest": approval.call.digest, "effect_digest": approval.effect_digest}
    )
    assert again.status_code == 409
