"""Pending approvals expire: denied with a message for the model (default), or kept."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth.models import User

from approvals import services
from approvals.models import ApprovalRequest, Decision
from audit.models import AuditEvent
from dispatcher.models import Status, ToolCall
from tests.approvals.conftest import ask
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db


@pytest.fixture
def short_timeout(settings: Any) -> Any:
    settings.HARNESS_APPROVAL_TIMEOUT = 0.05
    return settings


def test_expired_call_is_told_nobody_approved_and_audited(
    short_timeout: Any, agent: AgentFixture
) -> None:
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    fresh = ask(agent, {"path": "b.txt", "content": "y"})
    ApprovalRequest.objects.filter(pk=fresh.pk).update(
        expires_at=fresh.expires_at.replace(year=2999)
    )
    time.sleep(0.1)
    assert services.expire_due() == 1
    call = ToolCall.objects.get(pk=approval.call_id)
    assert call.status == Status.EXPIRED and call.decided_by == "expiry"
    assert call.content.startswith("Nobody approved this call within")
    assert ApprovalRequest.objects.get(pk=approval.pk).decision == Decision.EXPIRED
    assert AuditEvent.objects.filter(subject=f"call:{call.pk}", kind="call.expired").count() == 1
    assert ToolCall.objects.get(pk=fresh.call_id).status == Status.PENDING_APPROVAL
    assert services.expire_due() == 0  # idempotent


def test_keep_leaves_expired_approvals_pending(short_timeout: Any, agent: AgentFixture) -> None:
    short_timeout.HARNESS_EXPIRY_ACTION = "keep"
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    time.sleep(0.1)
    assert services.expire_due() == 0
    assert ToolCall.objects.get(pk=approval.call_id).status == Status.PENDING_APPROVAL
    assert not AuditEvent.objects.filter(subject=f"call:{approval.call_id}", kind="call.expired")


def test_a_decision_after_expiry_is_refused_naming_the_expiry(
    short_timeout: Any, agent: AgentFixture, reviewer: User
) -> None:
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    time.sleep(0.1)
    services.expire_due()
    with pytest.raises(services.DecisionRefused) as refused:
        services.decide(
            approval_id=approval.pk, user=reviewer, approve=True, digest=approval.call.digest
        )
    assert refused.value.status == 409
    assert "Already decided by expiry" in str(refused.value)


def test_a_decision_past_the_deadline_is_refused_before_the_sweep_runs(
    short_timeout: Any, agent: AgentFixture, reviewer: User
) -> None:
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    time.sleep(0.1)  # past expires_at; expire_due has not run
    with pytest.raises(services.DecisionRefused, match="Already decided by expiry") as refused:
        services.decide(
            approval_id=approval.pk, user=reviewer, approve=True, digest=approval.call.digest
        )
    assert refused.value.status == 409
    assert ToolCall.objects.get(pk=approval.call_id).status == Status.EXPIRED
    assert ApprovalRequest.objects.get(pk=approval.pk).decision == Decision.EXPIRED


def test_an_unknown_expiry_action_fails_the_start_up_checks(settings: Any) -> None:
    from django.core.checks import run_checks

    settings.HARNESS_EXPIRY_ACTION = "Keep"
    assert "approvals.E001" in {e.id for e in run_checks()}


def test_an_agent_cancel_closes_the_approval_request(
    agent: AgentFixture, client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    approval = ask(agent, {"path": "a.txt", "content": "x"})
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/api/v1/calls/{approval.call_id}/cancel", headers=agent.headers)
    assert response.status_code == 200
    approval.refresh_from_db()
    assert approval.decision == Decision.CANCELLED and approval.decided_at is not None
