"""Moving an agent to another team voids the bearer token of anyone shown it who does not
reach that team (dispatcher.agents.transfer_agent; docs/teams.md, docs/security.md).

A team admin who made an agent (and was shown its token) keeps no working token of it
after leaving the team (void_tokens_of_team_leaver). Before, moving the agent to a team
they are not in left them holding a working token of an agent of that team, acting
under its policy, with nothing to void it: they never left anything. Now the move voids
it as their leaving would, audited and told to the owner; holders who reach the new team
(its members, organization admins) keep theirs, and so do agents no such person holds.
"""

from __future__ import annotations

import pytest
from django.test import Client

from audit import roles
from audit.models import AuditEvent
from dispatcher import agents
from dispatcher.models import Status, ToolCall
from teams.services import add_member, create_team
from tests.support.factories import make_user, submit_one, unique

pytestmark = pytest.mark.django_db

VOIDED = "This agent token was voided"


def tools(token: str) -> tuple[int, str]:
    response = Client().get("/api/v1/tools", headers={"Authorization": f"Bearer {token}"})
    return response.status_code, response.content.decode()


def test_moving_an_agent_voids_the_token_of_a_team_admin_not_in_its_new_team() -> None:
    payments = create_team(name=unique("payments"), actor="t")
    infra = create_team(name=unique("infra"), actor="t")
    tess = make_user(unique("tess"))  # payments' admin, not in infra
    owner = make_user(unique("olga"), mode="trusted")
    add_member(team=payments, user=tess, role="admin", actor="t")
    add_member(team=payments, user=owner, role="reviewer", actor="t")
    add_member(team=infra, user=owner, role="reviewer", actor="t")
    agent, token = agents.create_agent(
        owner=owner, name=unique("agent"), actor="t", team=payments, shown_to=tess
    )
    queued = submit_one(
        agents.start_session(agent=agent), "write_file", {"path": "q", "content": "x"}
    )
    assert queued.status == Status.QUEUED and tools(token)[0] == 200

    assert agents.transfer_agent(agent=agent, team=infra, actor="user:root")

    status, body = tools(token)
    assert status == 401, body[:300]  # before: 200, an infra agent in the hands of tess
    assert VOIDED in body and f"because {tess.username}" in body and "moved to a team" in body
    voided = AuditEvent.objects.get(kind="agent.token_voided", subject=f"agent:{agent.pk}")
    assert voided.actor == "user:root" and voided.payload["because"] == tess.username
    assert f"not in the team {infra.name}" in voided.payload["reason"]
    queued.refresh_from_db()
    assert queued.status == Status.DENIED and "voided" in queued.content
    new = agents.rotate_token(agent=agent, actor="user:root", shown_to=owner)
    assert tools(new)[0] == 200


def test_holders_who_reach_the_new_team_keep_the_token() -> None:
    payments = create_team(name=unique("payments"), actor="t")
    infra = create_team(name=unique("infra"), actor="t")
    both = make_user(unique("bo"))  # an admin of both teams
    org_admin = make_user(unique("root"), groups=("admin",))
    owner = make_user(unique("olga"))
    for team in (payments, infra):
        add_member(team=team, user=both, role="admin", actor="t")
    made, made_token = agents.create_agent(
        owner=owner, name=unique("agent"), actor="t", team=payments, shown_to=both
    )
    by_org, org_token = agents.create_agent(
        owner=owner, name=unique("agent"), actor="t", team=payments, shown_to=org_admin
    )
    assert agents.transfer_agent(agent=made, team=infra, actor="t")
    assert agents.transfer_agent(agent=by_org, team=infra, actor="t")
    assert tools(made_token)[0] == tools(org_token)[0] == 200
    assert not AuditEvent.objects.filter(
        kind="agent.token_voided", subject__in=[f"agent:{made.pk}", f"agent:{by_org.pk}"]
    )


def test_a_holder_who_left_harness_and_a_change_of_owner_void_nothing_more() -> None:
    """A deactivated holder's copy was voided when they left, and the token rotated since
    was shown to someone who reaches the new team: the move keeps it. A new owner or
    sponsor alone moves the agent nowhere."""
    payments = create_team(name=unique("payments"), actor="t")
    infra = create_team(name=unique("infra"), actor="t")
    leaver = make_user(unique("ada"), groups=("admin",))
    owner = make_user(unique("olga"), groups=("admin",))
    agent, _ = agents.create_agent(
        owner=owner, name=unique("agent"), actor="t", team=payments, shown_to=leaver
    )
    assert roles.deactivate(user=leaver, actor="t")
    token = agents.rotate_token(agent=agent, actor="t", shown_to=owner)
    assert agents.transfer_agent(agent=agent, owner=make_user(unique("nora")), actor="t")
    assert agents.transfer_agent(agent=agent, team=infra, actor="t")
    assert tools(token)[0] == 200
    assert (
        AuditEvent.objects.filter(kind="agent.token_voided", subject=f"agent:{agent.pk}").count()
        == 1
    )
    assert not ToolCall.objects.filter(session__agent=agent)
