"""rt6, the people side: a person who leaves keeps acting through nothing. An agent a
client signed in for a person (OAuth consent, `harness-hook login`) holds its tokens in
that person's client: when they are deactivated it is revoked, never handed to a sponsor
with its tokens still working."""

from __future__ import annotations

import pytest

from agentauth.models import AgentClient
from audit.models import AuditEvent
from audit.roles import deactivate
from dispatcher import agents
from dispatcher.gateways import mcp_http
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
