"""Red team (rtweb): the human POSTs of this change refuse a request without the CSRF
token (a cross-site form): an agent's sign-out and revocation (/account/agents/), a
step-up challenge and a signed decision (/approvals/), the device page's approval, the
consent. Nothing is changed by such a request. Real HTTP (Django's client, checks on)."""

from __future__ import annotations

import pytest
from django.test import Client
from oauth2_provider.models import AccessToken

from agentauth.models import AgentClient
from approvals.models import ApprovalRequest
from dispatcher.models import Agent, Status
from tests.approvals.conftest import ask
from tests.approvals.test_step_up import WRITE, step_up_agent
from tests.redteam.test_rtstep_attacks import keyed_reviewer
from tests.support.oauth import (
    HOOKS,
    DocumentServer,
    documents,
    member,
    pending_device_code,
    sign_in_agent,
)

pytestmark = pytest.mark.django_db
__all__ = ["documents"]  # the fixture (tests/support/oauth.py)


def _browser(user: object) -> Client:
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)  # type: ignore[arg-type]
    return browser


def test_agent_sign_out_and_revoke_without_the_csrf_token_change_nothing(
    documents: DocumentServer,
) -> None:
    owner = member()
    client_id, _ = sign_in_agent(documents, owner, resource=HOOKS)
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    browser = _browser(owner)
    for action in ("sign-out", "revoke"):
        answer = browser.post(f"/account/agents/{agent.pk}/{action}")
        assert answer.status_code == 403, (action, answer.status_code)
    assert Agent.objects.get(pk=agent.pk).is_active
    assert AccessToken.objects.filter(harness__agent=agent).exists()


def test_step_up_and_decide_without_the_csrf_token_change_nothing() -> None:
    approval = ask(step_up_agent(), WRITE)
    _user, client, _key = keyed_reviewer()
    plain = Client(enforce_csrf_checks=True)
    plain.cookies = client.cookies  # the same signed-in session, no token sent
    assert (
        plain.post(f"/approvals/{approval.pk}/step-up", {"verdict": "approve"}).status_code == 403
    )
    decided = plain.post(
        f"/approvals/{approval.pk}/decide",
        {"action": "deny", "digest": approval.call.digest},
    )
    assert decided.status_code == 403
    assert ApprovalRequest.objects.get(pk=approval.pk).call.status == Status.PENDING_APPROVAL


def test_the_device_approval_without_the_csrf_token_approves_nothing() -> None:
    code = pending_device_code()
    person = member()
    answer = _browser(person).post("/oauth/device/", {"user_code": code, "action": "approve"})
    assert answer.status_code == 403
    assert not AgentClient.objects.filter(owner=person).exists()
