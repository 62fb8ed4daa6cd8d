""" "Approve and allow for the rest of this session" on the approval queue."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from dispatcher.policy.models import SessionGrant
from tests.support.factories import AgentFixture

from .conftest import start_session, submit

pytestmark = pytest.mark.django_db


def _decide(reviewer: User, approval: ApprovalRequest, action: str) -> Client:
    client = Client()
    client.force_login(reviewer)
    response = client.post(
        f"/approvals/{approval.pk}/decide",
        # (as the page posts them: a previewed command's effect digest too)
        {"action": action, "digest": approval.call.digest, "effect_digest": approval.effect_digest},
        headers={"HX-Request": "true"},
    )
    return response  # type: ignore[return-value]


def test_approving_for_the_session_grants_the_exact_command(
    agent: AgentFixture, reviewer: User
) -> None:
    session = start_session(agent)
    call = submit(agent, session, "c1", "run_command", {"argv": ["npm", "test"]})
    approval = ApprovalRequest.objects.get(call=call)
    response = _decide(reviewer, approval, "approve_session")
    assert response.status_code == 200
    assert "Allowed &#x27;run_command(npm test)&#x27; for the rest of this session." in (
        response.content.decode()
    )
    call.refresh_from_db()
    assert call.status == "queued" and call.decided_by == f"user:{reviewer.username}"
    grant = SessionGrant.objects.get(session_id=session)
    assert (grant.rule, grant.granted_by, grant.call_id) == (
        "run_command(npm test)",
        reviewer,
        call.pk,
    )
    approved = AuditEvent.objects.get(kind="call.approved", subject=f"call:{call.pk}")
    assert approved.payload["session_grant"] == "run_command(npm test)"

    again = submit(agent, session, "c2", "run_command", {"argv": ["npm", "test"]})
    assert again.status == "queued" and again.decided_by == "grant:run_command(npm test)"
    other = submit(agent, session, "c3", "run_command", {"argv": ["npm", "publish"]})
    assert other.status == "denied"  # the command guard, never a grant


def test_plain_approve_grants_nothing(agent: AgentFixture, reviewer: User) -> None:
    session = start_session(agent)
    call = submit(agent, session, "w1", "write_file", {"path": "a.txt", "content": ""})
    assert _decide(reviewer, ApprovalRequest.objects.get(call=call), "approve").status_code == 200
    assert not SessionGrant.objects.filter(session_id=session).exists()
    again = submit(agent, session, "w2", "write_file", {"path": "a.txt", "content": ""})
    assert again.status == "pending_approval"


def test_no_narrow_rule_means_no_decision(agent: AgentFixture, reviewer: User) -> None:
    session = start_session(agent)
    call = submit(
        agent, session, "c1", "run_command", {"argv": ["bash", "-c", "make && make install"]}
    )
    response = _decide(reviewer, ApprovalRequest.objects.get(call=call), "approve_session")
    assert response.status_code == 400
    assert "without a session grant" in response.content.decode()
    call.refresh_from_db()
    assert call.status == "pending_approval"
    assert not SessionGrant.objects.exists()
