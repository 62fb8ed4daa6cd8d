"""A client's signed-in agent has a bearer token nobody was shown, and after "Sign out" one
whose prefix starts with `out` (dispatcher.agents._new_sign_in): the agents' pages showed
that prefix (`out1a2b3c4d…`) as if it were the agent's token. They now say how the agent
is signed in (templates/components/agent_token.html), never that prefix."""

from __future__ import annotations

import pytest
from django.test import Client

from dispatcher.gateways import mcp_http
from dispatcher.models import SIGNED_OUT_PREFIX, Agent
from teams.services import add_member, create_team
from tests.support.factories import make_agent, make_user, unique
from tests.support.oauth import MCP, DocumentServer, documents, member, sign_in_agent, signed_in

pytestmark = pytest.mark.django_db
__all__ = ["documents"]  # the fixture (tests/support/oauth.py)


def _pages(admin: Client, agent: Agent) -> dict[str, str]:
    got = {}
    for url in ("/agents/", f"/agents/{agent.pk}/"):
        page = admin.get(url)
        assert page.status_code == 200, url
        got[url] = page.content.decode()
    return got


def _token_cell(url: str, page: str, agent: Agent) -> str:
    """The agent's row of the list, or the Token fact of its page."""
    if url == "/agents/":
        [row] = [row for row in page.split("<tr")[1:] if f"/agents/{agent.pk}/" in row]
        return row
    start = page.index("<dt>Token</dt>")
    return page[start : page.index("</dd>", start)]


def test_a_signed_out_agent_is_shown_signed_out_not_a_token(documents: DocumentServer) -> None:
    team = create_team(name=unique("team"), actor="test")
    person = member(team)
    admin = make_user(unique("admin"))
    add_member(team=team, user=admin, role="admin", actor="test")
    browser = Client()
    browser.force_login(admin)
    client_id, answer = sign_in_agent(documents, person, team=team)
    agent = mcp_http.authenticate(answer["access_token"], "", MCP)[0]
    assert agent is not None
    for url, page in _pages(browser, agent).items():
        cell = _token_cell(url, page, agent)
        assert "signed in" in cell and agent.token_prefix not in cell

    assert signed_in(person).post(f"/account/agents/{agent.pk}/sign-out").status_code == 302
    agent.refresh_from_db()
    assert agent.token_prefix.startswith(SIGNED_OUT_PREFIX)
    for url, page in _pages(browser, agent).items():
        assert agent.token_prefix not in page, url  # before: `out…` shown as its token
        assert "signed out" in _token_cell(url, page, agent), url

    # Signed in again (the same agent, its prefix still the sign-out's): signed in.
    sign_in_agent(documents, person, client_id=client_id, team=team)
    assert Agent.objects.get(pk=agent.pk).token_prefix == agent.token_prefix
    for url, page in _pages(browser, agent).items():
        assert agent.token_prefix not in page, url
        cell = _token_cell(url, page, agent)
        assert "signed in" in cell and "signed out" not in cell, url


def test_an_agent_with_a_bearer_token_still_shows_its_prefix() -> None:
    fixture = make_agent()
    admin = make_user(unique("org-admin"), groups=("admin",))
    browser = Client()
    browser.force_login(admin)
    for url, page in _pages(browser, fixture.agent).items():
        assert f"<code>{fixture.agent.token_prefix}…</code>" in page, url
