"""Review of the OAuth changes: deleting a dynamically registered client (RFC 7592, the
management endpoint this change routed) while a person's agent is signed in through it."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlencode

import httpx
import pytest

from tests.support.live import LiveStack
from tests.support.oauth import document_server, pkce
from tests.support.oauth_live import OAuthStack, Person, oauth_daphne, query_of, team_member

pytestmark = [pytest.mark.live]
CALLBACK = "http://127.0.0.1:5555/callback"
NATIVE = {
    "client_name": "Deleted Later",
    "redirect_uris": ["http://127.0.0.1/callback"],
    "grant_types": ["authorization_code", "refresh_token"],
    "token_endpoint_auth_method": "none",
}


@pytest.fixture(scope="module")
def stack(live_stack: LiveStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OAuthStack]:
    tmp = tmp_path_factory.mktemp("review-dcr")
    with (
        document_server(tmp) as documents,
        oauth_daphne(live_stack, documents, tmp, HARNESS_OAUTH_DYNAMIC_REGISTRATION="true") as s,
    ):
        yield s


def test_deleting_a_registered_client_revokes_its_signed_in_agent(
    stack: OAuthStack, live_db: None
) -> None:
    from agentauth.models import AgentClient
    from audit.models import AuditEvent
    from dispatcher.models import Agent

    owner = team_member()
    who = Person(stack.url, owner.username, "pw-" + owner.username)
    csrf = who.http.cookies.get("csrftoken") or ""
    registered = who.http.post(
        "/oauth/register/",
        json=NATIVE,
        headers={"X-CSRFToken": csrf, "Referer": stack.url + "/", "Origin": stack.url},
    )
    assert registered.status_code == 201, registered.text[:300]
    client_id = registered.json()["client_id"]
    _verifier, challenge = pkce()
    query = urlencode(
        {
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": CALLBACK,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "state": "s",
            "resource": stack.url + "/mcp/",
        }
    )
    assert "code" in query_of(who.consent(f"{stack.url}/oauth/authorize/?{query}"))
    agent = AgentClient.objects.get(application__client_id=client_id).agent
    deleted = httpx.delete(
        registered.json()["registration_client_uri"],
        headers={"Authorization": f"Bearer {registered.json()['registration_access_token']}"},
    )
    assert deleted.status_code == 204, deleted.text
    # What a person observes: the agent their client signed in is gone with the client
    # (revoked and audited), not left active, uncounted by the signed-in agents cap and
    # open to a bearer-token rotation (rotate_token refuses only agents with a client).
    agent = Agent.objects.get(pk=agent.pk)
    revoked = AuditEvent.objects.filter(kind="agent.revoked", subject=f"agent:{agent.pk}")
    assert not agent.is_active and revoked.exists(), (agent.is_active, agent.name)
