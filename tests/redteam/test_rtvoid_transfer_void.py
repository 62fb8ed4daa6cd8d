"""Red team (rtvoid): can transfer_agent's void be skipped by a holder who reaches the new
team only by a role they lose afterwards? An organization admin shown the token keeps it
through the move (they reach every team); losing the admin role is leaving each team they
are not a member of (audit.roles._left_unjoined_teams), which voids it then. Held."""

from __future__ import annotations

import pytest
from django.test import Client

from audit import roles
from dispatcher import agents
from dispatcher.models import Status
from teams.services import add_member, create_team
from tests.support.factories import make_user, submit_one, unique

pytestmark = pytest.mark.django_db


def tools(token: str) -> int:
    return Client().get("/api/v1/tools", headers={"Authorization": f"Bearer {token}"}).status_code


def test_an_org_admin_who_kept_a_moved_agents_token_loses_it_with_the_role() -> None:
    payments = create_team(name=unique("payments"), actor="t")
    infra = create_team(name=unique("infra"), actor="t")
    ada = make_user(unique("ada"), groups=("admin",))  # in no team
    owner = make_user(unique("olga"), mode="trusted")
    add_member(team=payments, user=owner, role="reviewer", actor="t")
    add_member(team=infra, user=owner, role="reviewer", actor="t")
    agent, token = agents.create_agent(
        owner=owner, name=unique("agent"), actor="t", team=payments, shown_to=ada
    )
    assert agents.transfer_agent(agent=agent, team=infra, actor="user:root")
    assert tools(token) == 200  # an organization admin reaches infra: kept
    queued = submit_one(
        agents.start_session(agent=agent), "write_file", {"path": "q", "content": "x"}
    )
    assert queued.status == Status.QUEUED
    assert roles.remove_role(user=ada, role="admin", actor="user:root")
    assert tools(token) == 401  # voided with the role
    queued.refresh_from_db()
    assert queued.status == Status.DENIED and "voided" in queued.content
