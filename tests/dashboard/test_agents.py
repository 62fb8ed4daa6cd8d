"""Agents in the dashboard: create (token shown once), rotate, revoke, all audited through
the same services as the management commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import Client

from audit import kinds
from audit.models import AuditEvent
from dispatcher import agents
from dispatcher.models import Agent, AgentSession
from floor.errors import ServiceError
from tests.support.factories import make_agent, make_user, unique

pytestmark = pytest.mark.django_db

TOKEN = re.compile(r'value="(hrn_[0-9a-f]{8}_[A-Za-z0-9_-]+)"')


@pytest.fixture
def admin(client: Client) -> tuple[Client, str]:
    name = unique("admin")
    client.force_login(make_user(name, groups=("admin", "auditor")))
    return client, name


def events(kind: str, agent: Agent) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(kind=kind, subject=f"agent:{agent.pk}"))


@pytest.mark.parametrize("groups", [(), ("reviewer",), ("auditor",)])
def test_only_admins_get_in(client: Client, groups: tuple[str, ...]) -> None:
    fx = make_agent()
    client.force_login(make_user(unique("u"), groups=groups))
    for url in ("/agents/", f"/agents/{fx.agent.pk}/"):
        assert client.get(url).status_code == 403
    assert client.post(f"/agents/{fx.agent.pk}/rotate").status_code == 403
    assert client.post(f"/agents/{fx.agent.pk}/revoke").status_code == 403
    assert Agent.objects.get(pk=fx.agent.pk).is_active
    assert Client().get("/agents/").status_code == 302  # anonymous: sign in


def test_create_shows_the_token_once_and_audits(admin: tuple[Client, str]) -> None:
    client, me = admin
    owner = make_user(unique("owner"))
    response = client.post("/agents/", {"name": "ci-bot", "owner": owner.username, "workspace": ""})
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    token = TOKEN.search(response.content.decode()).group(1)  # type: ignore[union-attr]
    agent = agents.authenticate_token(token)
    assert agent is not None and agent.name == "ci-bot" and agent.owner == owner
    [event] = events(kinds.AGENT_CREATED, agent)
    assert event.actor == f"user:{me}" and event.payload["owner"] == owner.username
    again = client.get(f"/agents/{agent.pk}/").content.decode()
    assert token not in again and "copy it now" not in again  # never shown again
    assert agent.token_prefix in again


def test_no_agent_gets_a_fixed_workspace_inside_a_system_directory(
    admin: tuple[Client, str],
) -> None:
    """Even an organization admin's fixed workspace is refused inside /etc, /usr or /root
    (as root, the sandbox user would get it), before anything is made there."""
    from django.core.management import CommandError, call_command

    client, _ = admin
    owner = make_user(unique("owner"))
    where = f"/etc/{unique('harness-test')}/profile.d"
    answer = client.post("/agents/", {"name": "fixed", "owner": owner.username, "workspace": where})
    assert answer.status_code == 400
    page = answer.content.decode()
    assert f"The workspace {where} lies inside the system directory /etc" in page
    assert "Choose a directory of its own" in page
    assert not Agent.objects.filter(name="fixed").exists()
    assert not Path(where).parent.exists()  # nothing made there
    with pytest.raises(CommandError, match="lies inside the system directory /usr"):
        call_command(
            "create_agent", "fixed", "--owner", owner.username, "--workspace", "/usr/local/bin"
        )
    with pytest.raises(ServiceError, match="lies inside the system directory /root"):
        agents.create_agent(owner=owner, name="fixed", workspace="/root/.ssh", actor="test")
    assert not Agent.objects.filter(name="fixed").exists()


@pytest.mark.parametrize(
    ("form", "says"),
    [
        ({"name": "", "owner": "OWNER"}, "Give the agent a name"),
        ({"name": "x" * 101, "owner": "OWNER"}, "Give the agent a name"),
        ({"name": "dup", "owner": "OWNER"}, "already has an agent named"),
        ({"name": "ok", "owner": "nobody-here"}, "Choose the user who owns"),
    ],
)
def test_bad_create_forms_say_what_to_fix(
    admin: tuple[Client, str], form: dict[str, str], says: str
) -> None:
    client, _ = admin
    owner = make_user(unique("owner"))
    agents.create_agent(owner=owner, name="dup", actor="test")
    form = {k: v.replace("OWNER", owner.username) for k, v in form.items()}
    before = Agent.objects.count()
    response = client.post("/agents/", form)
    assert response.status_code == 400
    assert says in response.content.decode()
    assert Agent.objects.count() == before


def test_rotate_gives_a_new_token_and_stops_the_old(admin: tuple[Client, str]) -> None:
    client, me = admin
    fx = make_agent()
    old_prefix = fx.agent.token_prefix
    response = client.post(f"/agents/{fx.agent.pk}/rotate")
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    token = TOKEN.search(response.content.decode()).group(1)  # type: ignore[union-attr]
    assert agents.authenticate_token(fx.token) is None
    assert agents.authenticate_token(token) == fx.agent
    [event] = events(kinds.AGENT_TOKEN_ROTATED, fx.agent)
    assert event.actor == f"user:{me}"
    assert event.payload["old_token_prefix"] == old_prefix
    assert event.payload["token_prefix"] == token.split("_")[1] != old_prefix


def test_revoke_stops_the_token_and_a_revoked_agent_cannot_rotate(
    admin: tuple[Client, str],
) -> None:
    client, me = admin
    fx = make_agent()
    response = client.post(f"/agents/{fx.agent.pk}/revoke", follow=True)
    assert "no longer works" in response.content.decode()
    assert agents.authenticate_token(fx.token) is None
    [event] = events(kinds.AGENT_REVOKED, fx.agent)
    assert event.actor == f"user:{me}"
    page = client.post(f"/agents/{fx.agent.pk}/rotate", follow=True).content.decode()
    assert "is revoked; create a new agent instead" in page
    assert TOKEN.search(page) is None and not events(kinds.AGENT_TOKEN_ROTATED, fx.agent)
    with pytest.raises(ServiceError):
        agents.rotate_token(agent=fx.agent, actor="cli")


def test_detail_shows_activity_sessions_mode_and_snippets(admin: tuple[Client, str]) -> None:
    client, _ = admin
    owner = make_user(unique("owner"), mode="read_only")
    agent, _ = agents.create_agent(owner=owner, name="x'; rm -rf / #<b>", actor="test")
    session = AgentSession.objects.create(
        agent=agent, team_id=agent.team_id, title="fix <i>it</i>", mode="read_only", workspace="/w"
    )
    html = client.get(f"/agents/{agent.pk}/").content.decode()
    assert "read_only" in html and "fix &lt;i&gt;it&lt;/i&gt;" in html
    assert f"/audit/sessions/{session.pk}/" in html
    assert (
        "claude mcp add --transport http harness http://testserver/mcp/ --header "
        '"Authorization: Bearer $HARNESS_TOKEN"'
    ) in html.replace("&quot;", '"')
    # The name is quoted for the shell and escaped for HTML.
    assert (
        "claude_code_settings --agent &#x27;x&#x27;&quot;&#x27;&quot;&#x27;; rm -rf / #&lt;b&gt;&#x27;"
        in html
    )
    assert "<b>" not in html.split("<main>")[1]


def test_missing_agents_are_404(admin: tuple[Client, str]) -> None:
    client, _ = admin
    assert client.get("/agents/999999/").status_code == 404
    assert client.post("/agents/999999/rotate").status_code == 404
    assert client.post("/agents/999999/revoke").status_code == 404
