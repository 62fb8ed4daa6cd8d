"""One person, many clients: every client a person approves (a metadata document at any
URL they publish, a dynamically registered client) made a new agent of theirs, with no
bound. Each agent had its own share of the execution queue, its own request rate and its
own wait slots, so fifty approvals gave one person fifty shares. Now a person holds at
most HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON active agents made that way."""

from __future__ import annotations

import pytest
from django.test import override_settings

from agentauth.models import AgentClient
from audit.models import AuditEvent
from tests.support.factories import unique
from tests.support.oauth import (
    REDIRECT,
    DocumentServer,
    authorize_params,
    code_from,
    consent,
    documents,
    member,
    pkce,
    signed_in,
)

pytestmark = pytest.mark.django_db

__all__ = ["documents"]  # the fixture (tests/support/oauth.py)


@override_settings(HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON=2)
def test_a_person_cannot_sign_in_agents_without_bound(documents: DocumentServer) -> None:
    person = member()
    browser = signed_in(person)
    clients = [documents.client(f"/{unique('c')}.json", [REDIRECT]) for _ in range(3)]
    for client_id in clients[:2]:
        code_from(consent(browser, authorize_params(client_id, pkce()[1])))
    refused = consent(browser, authorize_params(clients[2], pkce()[1]))
    assert refused.status_code == 403, refused.content[:500]
    text = refused.content.decode()
    assert "You already have 2 agents signed in" in text, text
    assert "HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON is 2" in text, text
    assert AgentClient.objects.filter(owner=person).count() == 2  # nothing made
    assert (
        AuditEvent.objects.filter(kind="agent.authorized", payload__owner=person.username).count()
        == 2
    )

    # A client approved already is approved again (its agent reused, nothing new made).
    code_from(consent(browser, authorize_params(clients[0], pkce()[1])))
    # Revoking one frees a place.
    agent = AgentClient.objects.filter(owner=person).first()
    assert agent is not None
    assert signed_in(person).post(f"/account/agents/{agent.agent_id}/revoke").status_code == 302
    code_from(consent(browser, authorize_params(clients[2], pkce()[1])))
    assert AgentClient.objects.filter(owner=person, agent__is_active=True).count() == 2

    # Another person's count is their own.
    other = member()
    code_from(consent(signed_in(other), authorize_params(clients[2], pkce()[1])))


@override_settings(HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON=2)
def test_approving_and_revoking_again_and_again_is_bounded(documents: DocumentServer) -> None:
    """A revoked agent is never made active again: each approval after a revocation made a
    new agent row, and the cap counts active ones only, so approve, revoke, approve again
    grew the agents table without bound. At most twice the cap new agents an hour."""
    from dispatcher.models import Agent

    person = member()
    browser = signed_in(person)
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    for _ in range(4):
        code_from(consent(browser, authorize_params(client_id, pkce()[1])))
        agent = Agent.objects.get(owner=person, is_active=True)
        assert browser.post(f"/account/agents/{agent.pk}/revoke").status_code == 302
    refused = consent(browser, authorize_params(client_id, pkce()[1]))
    assert refused.status_code == 403, refused.content[:500]
    text = refused.content.decode()
    assert "You were given 4 new agents through clients in the last hour" in text, text
    assert Agent.objects.filter(owner=person).count() == 4  # nothing made
