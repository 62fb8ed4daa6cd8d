"""rt6, the people side: a person who leaves keeps acting through nothing. An agent a
client signed in for a person (OAuth consent, `harness-hook login`) holds its tokens in
that person's client: when they are deactivated it is revoked, never handed to a sponsor
with its tokens still working."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from agentauth.models import AgentClient
from audit.models import AuditEvent
from audit.roles import deactivate
from dispatcher import agents
from dispatcher.gateways import mcp_http
from teams.models import Team
from tests.support.factories import make_user, unique
from tests.support.oauth import MCP, DocumentServer, documents, member, sign_in_agent

pytestmark = pytest.mark.django_db
__all__ = ["documents"]  # the fixture (tests/support/oauth.py)


@pytest.mark.parametrize("sponsor_by", ["agent", "deactivation"])
def test_a_deactivated_persons_signed_in_agent_is_revoked_not_handed_over(
    documents: DocumentServer, sponsor_by: str
) -> None:
    person = member()
    _, issued = sign_in_agent(documents, person)
    agent = AgentClient.objects.get(owner=person).agent
    sponsor = make_user(unique("sponsor"))
    if sponsor_by == "agent":
        agents.transfer_agent(agent=agent, sponsor=sponsor, actor="admin")
    bearer, bearer_token = agents.create_agent(
        owner=person, name=unique("ci"), team=agent.team, actor="admin"
    )
    assert mcp_http.authenticate(issued["access_token"], "", MCP)[0] is not None

    deactivate(
        user=person, actor="admin:ops", sponsor=sponsor if sponsor_by == "deactivation" else None
    )

    # The token in the leaver's client stops: not working on under the sponsor's rules.
    assert mcp_http.authenticate(issued["access_token"], "", MCP) == (None, None)
    agent.refresh_from_db()
    assert not agent.is_active
    event = AuditEvent.objects.filter(kind="user.deactivated").latest("id")
    assert event.payload["signed_in_agents_revoked"] == [agent.name]
    assert AuditEvent.objects.filter(kind="agent.signed_out", subject=f"agent:{agent.pk}").exists()
    if sponsor_by == "deactivation":  # an admin's bearer agent is still handed over
        assert mcp_http.authenticate(bearer_token, "", MCP)[0] == bearer
        bearer.refresh_from_db()
        assert bearer.owner == sponsor


def test_a_signed_in_agent_gets_no_bearer_token_by_rotation(documents: DocumentServer) -> None:
    """An agent a person signed in through their client runs in the mode they consented
    to (here read_only) with tokens only their client holds: its team's admin rotated its
    bearer token and held a credential of that person's agent, in the person's own mode."""
    from dispatcher.models import AgentSession
    from teams.services import add_member
    from tests.support.oauth import (
        REDIRECT,
        authorize_params,
        code_from,
        consent,
        pkce,
        signed_in,
        token,
    )

    person = member()
    team = Team.objects.get(memberships__user=person)
    admin = make_user(unique("teamadmin"))
    add_member(team=team, user=admin, role="admin", actor="test")
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    verifier, challenge = pkce()
    params = authorize_params(client_id, challenge)
    query = code_from(consent(signed_in(person), params, mode="read_only", team=team))
    issued = token(client_id, query["code"][0], verifier).json()
    agent = AgentClient.objects.get(owner=person).agent
    hash_before = agent.token_hash

    answer = signed_in(admin).post(f"/agents/{agent.pk}/rotate", follow=True)

    page = answer.content.decode()
    # Whatever token the page shows starts no session past the consented read_only.
    for shown in set(re.findall(r"hrn_[0-9a-f]{8}_[A-Za-z0-9_-]+", page)):
        started = Client().post(
            "/api/v1/sessions",
            data="{}",
            content_type="application/json",
            headers={"Authorization": f"Bearer {shown}"},
        )
        assert started.status_code == 401, started.json()
    assert "signed in by its owner" in page
    agent.refresh_from_db()
    assert agent.token_hash == hash_before
    assert not AuditEvent.objects.filter(
        kind="agent.token_rotated", subject=f"agent:{agent.pk}"
    ).exists()
    assert not AgentSession.objects.filter(agent=agent).exclude(mode="read_only").exists()
    assert mcp_http.authenticate(issued["access_token"], "", MCP)[0] == agent
