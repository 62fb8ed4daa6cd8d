"""A consent racing its client's deletion. The consent made the agent's link to a client
that was gone by the commit: a foreign key error there, a 500. Now the person is told the
client no longer exists and nothing is approved."""

from __future__ import annotations

import pytest
from django.db import transaction
from oauth2_provider.models import get_application_model

from agentauth import services
from agentauth.models import AgentClient
from floor.errors import ServiceError
from teams.models import Team
from tests.support.factories import unique
from tests.support.oauth import (
    REDIRECT,
    DocumentServer,
    authorize_params,
    documents,
    member,
    pkce,
    signed_in,
)

__all__ = ["documents"]  # the fixture (tests/support/oauth.py)


@pytest.mark.django_db
def test_a_client_deleted_between_the_page_and_the_approval_is_said_gone(
    documents: DocumentServer,
) -> None:
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    person = member()
    browser = signed_in(person)
    params = authorize_params(client_id, pkce()[1])
    page = browser.get("/oauth/authorize/", params)
    assert page.status_code == 200, page.content[:500]
    application = get_application_model().objects.get(client_id=client_id)
    services.delete_client(application=application, actor="test")

    form = {**params, "scope": "agent", "allow": "Authorize", "mode": "standard"}
    form["team"] = str(page.context["teams"][0].pk)
    answer = browser.post("/oauth/authorize/", form)
    assert answer.status_code == 400, answer.content[:500]
    assert b"This client no longer exists" in answer.content
    assert b"Start the sign-in again from the client" in answer.content
    assert not AgentClient.objects.filter(owner=person).exists()


@pytest.mark.django_db(transaction=True)
def test_a_consent_whose_client_went_meanwhile_approves_nothing(
    documents: DocumentServer,
) -> None:
    """The view found the client; it was deleted (committed) before the consent's
    transaction: the agent's link failed the foreign key at commit (IntegrityError)."""
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT], name="Gone Client")
    person = member()
    page = signed_in(person).get("/oauth/authorize/", authorize_params(client_id, pkce()[1]))
    assert page.status_code == 200, page.content[:500]
    application = get_application_model().objects.get(client_id=client_id)
    get_application_model().objects.filter(pk=application.pk).delete()
    team = Team.objects.get(pk=page.context["teams"][0].pk)
    gone = "The client 'Gone Client' no longer exists"
    with pytest.raises(ServiceError, match=gone), transaction.atomic():
        services.authorize_agent(
            owner=person, application=application, team=team, mode="standard", actor="t"
        )
    assert not AgentClient.objects.filter(owner=person).exists()
