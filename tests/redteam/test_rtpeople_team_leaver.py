"""Red team of the leavers' tokens (docs/identity.md, "Leaving: a team"): a team admin who
leaves the team keeps no bearer token of its agents they were shown.

A team admin creates an agent for a member of their team in the dashboard, and is shown
its token (Agent.token_holders names them). Before, taking their admin role in that team
away (by hand on the team's page, `manage.py remove_member`, or the identity provider's
group map) left that token working: a person outside the team went on acting as its
agent, under its owner's rules, until someone happened to rotate it. Only a deactivation
voided it. Now leaving the team voids it as a deactivation does (agent.token_voided, its
reason the team), and the 401 says why; an organization admin, who reaches every team's
agents whatever teams they are in, keeps theirs.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit.models import AuditEvent
from dispatcher.models import Agent
from teams.models import Team
from teams.services import add_member, create_team, remove_member
from tests.support.factories import make_user, unique

TOKEN = re.compile(r"hrn_[0-9a-f]{8}_[A-Za-z0-9_-]{20,}")
VOIDED = "This agent token was voided"


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def tools(token: str) -> tuple[int, str]:
    response = Client().get("/api/v1/tools", headers={"Authorization": f"Bearer {token}"})
    return response.status_code, response.content.decode()


def made_in_dashboard(creator: User, owner: User, team: Team) -> tuple[Agent, str]:
    """The agent `creator` makes for `owner` on /agents/, and the token the page shows."""
    name = unique("agent")
    page = signed_in(creator).post(
        "/agents/", {"name": name, "owner": owner.username, "team": team.name}
    )
    assert page.status_code == 200, page.content.decode()[:500]
    [token] = set(TOKEN.findall(page.content.decode()))
    return Agent.objects.get(owner=owner, name=name), token


@pytest.mark.django_db
def test_a_team_admin_removed_from_the_team_loses_the_token_they_were_shown() -> None:
    team = create_team(name=unique("payments"), actor="t")
    create_team(name=unique("other"), actor="t")
    root = make_user(unique("root"), groups=("admin",))
    tess = make_user(unique("tess"))  # the team's admin, who will leave it
    owner = make_user(unique("olga"), mode="standard")
    add_member(team=team, user=tess, role="admin", actor="t")
    add_member(team=team, user=owner, role="reviewer", actor="t")
    agent, token = made_in_dashboard(tess, owner, team)
    assert agent.token_holders == [tess.pk]
    assert tools(token)[0] == 200

    removed = signed_in(root).post(
        f"/teams/{team.pk}/members/remove", {"user": tess.username, "role": "admin"}
    )
    assert removed.status_code == 302
    assert not team.memberships.filter(user=tess).exists()

    status, body = tools(token)
    assert status == 401, body[:300]  # before: 200, acting as olga's agent from outside the team
    assert VOIDED in body and f"because {tess.username}" in body and "left the agent's team" in body
    event = AuditEvent.objects.get(kind="agent.token_voided", subject=f"agent:{agent.pk}")
    assert event.payload["because"] == tess.username
    assert event.payload["reason"].endswith(f"left the team {team.name}")
    left = AuditEvent.objects.get(kind="team.member_removed", subject=f"team:{team.pk}")
    assert left.payload["agent_tokens_voided"] == [agent.name]
    agent.refresh_from_db()
    assert agent.is_active and agent.owner == owner  # the agent stays, for a rotation


@pytest.mark.django_db
def test_leaving_one_team_leaves_the_tokens_of_another_and_an_org_admins() -> None:
    """Only the team left: a token of an agent of a team they still administer works, and
    so does a token an organization admin was shown (they reach every team's agents)."""
    team, stays = (create_team(name=unique(n), actor="t") for n in ("payments", "search"))
    tess = make_user(unique("tess"))
    root = make_user(unique("root"), groups=("admin",))
    owner = make_user(unique("olga"), mode="standard")
    other = make_user(unique("otto"), mode="standard")
    for t, person in ((team, owner), (stays, other)):
        add_member(team=t, user=tess, role="admin", actor="t")
        add_member(team=t, user=root, role="admin", actor="t")
        add_member(team=t, user=person, role="reviewer", actor="t")
    _, kept = made_in_dashboard(tess, other, stays)
    _, roots = made_in_dashboard(root, owner, team)
    _, gone = made_in_dashboard(tess, owner, team)
    assert remove_member(team=team, user=tess, role="admin", actor="t")
    assert remove_member(team=team, user=root, role="admin", actor="t")
    assert tools(gone)[0] == 401
    assert tools(kept)[0] == 200
    assert tools(roots)[0] == 200


@pytest.mark.django_db
def test_an_org_admin_who_loses_the_role_loses_the_tokens_of_teams_they_never_joined() -> None:
    """An organization admin reaches every team without joining it: losing the role is
    leaving each of those teams (audit.roles.remove_role), so a token of their agents
    they were shown stops too, not only the agents they own."""
    from audit import roles

    team = create_team(name=unique("payments"), actor="t")
    create_team(name=unique("other"), actor="t")
    root = make_user(unique("root"), groups=("admin",))
    owner = make_user(unique("olga"), mode="standard")
    add_member(team=team, user=owner, role="reviewer", actor="t")
    agent, token = made_in_dashboard(root, owner, team)
    assert tools(token)[0] == 200
    assert roles.remove_role(user=root, role="admin", actor="user:chief")
    status, body = tools(token)
    assert status == 401, body[:300]  # before: 200, a former admin acting as olga's agent
    assert VOIDED in body and f"because {root.username}" in body
    event = AuditEvent.objects.get(kind="role.removed", subject=f"user:{root.username}")
    assert event.payload["agent_tokens_voided"] == [agent.name]


@pytest.mark.django_db
def test_no_token_of_the_teams_agents_is_shown_to_someone_who_left_it_meanwhile() -> None:
    """The rotate and create pages check the admin's reach when the request starts; the
    leaving may commit between that check and the token's recording. Before, the token
    was then recorded as theirs after the leaving's step had read the holders: it was
    never voided, and they acted as the team's agent from outside it. Now the service
    refuses (their membership is read, and locked, with the token's recording), and no
    token is issued; an organization admin, who reaches every team, is still shown one."""
    from dispatcher import agents
    from floor.errors import ServiceError

    team = create_team(name=unique("payments"), actor="t")
    root = make_user(unique("root"), groups=("admin",))
    tess = make_user(unique("tess"))
    owner = make_user(unique("olga"), mode="standard")
    add_member(team=team, user=tess, role="admin", actor="t")
    add_member(team=team, user=owner, role="reviewer", actor="t")
    agent, token = made_in_dashboard(tess, owner, team)
    assert remove_member(team=team, user=tess, role="admin", actor="user:root")
    assert tools(token)[0] == 401  # the token she was shown is voided

    with pytest.raises(ServiceError, match="not in the agent's team"):
        agents.rotate_token(agent=agent, actor="user:tess", shown_to=tess)
    agent.refresh_from_db()
    assert tess.pk in agent.token_holders and agent.token_voided_at is not None  # unchanged
    with pytest.raises(ServiceError, match="not in the agent's team"):
        agents.create_agent(
            owner=owner, name=unique("agent"), team=team, actor="user:tess", shown_to=tess
        )
    assert not Agent.objects.filter(team=team).exclude(pk=agent.pk).exists()

    fresh = agents.rotate_token(agent=agent, actor="user:root", shown_to=root)
    assert tools(fresh)[0] == 200
