"""rt6, the people side: team boundaries and roles, through real requests (Django's test
client over the real URLconf, PostgreSQL or SQLite as configured)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit.models import AuditEvent
from teams.models import Membership
from tests.teams.world import TeamWorld, make_team

db = pytest.mark.django_db


@pytest.fixture
def pay() -> TeamWorld:
    return make_team("pay")


@db
@pytest.mark.parametrize("role", ["reviewer", "auditor", "admin"])
def test_a_team_admin_gives_no_role_to_themselves(pay: TeamWorld, role: str) -> None:
    """A team admin who made themselves their team's reviewer would approve the calls of
    the agents they manage (and whose tokens they made), past the organization's ask
    rules: their own roles are given by an organization admin."""
    admin = pay.members["admin"]
    held = set(Membership.objects.filter(user=admin).values_list("team_id", "role"))
    events = AuditEvent.objects.filter(kind="team.member_added").count()
    response = pay.client("admin").post(
        f"/teams/{pay.team.pk}/members/add", {"user": admin.username, "role": role}
    )
    assert response.status_code == 403
    assert "give yourself a role" in response.content.decode()
    assert set(Membership.objects.filter(user=admin).values_list("team_id", "role")) == held
    assert AuditEvent.objects.filter(kind="team.member_added").count() == events
    if role == "reviewer":
        assert pay.client("admin").get("/approvals/").status_code == 403


@db
def test_a_team_admin_still_adds_others_and_leaves_a_role_and_an_org_admin_adds_themselves(
    pay: TeamWorld,
) -> None:
    admin = pay.members["admin"]
    other = User.objects.create_user("rt6-" + pay.team.name)
    response = pay.client("admin").post(
        f"/teams/{pay.team.pk}/members/add", {"user": other.username, "role": "reviewer"}
    )
    assert response.status_code == 302
    assert Membership.objects.filter(team=pay.team, user=other, role="reviewer").exists()
    org = User.objects.create_user("rt6-org-" + pay.team.name, is_superuser=True)
    client = Client()
    client.force_login(org)
    response = client.post(
        f"/teams/{pay.team.pk}/members/add", {"user": org.username, "role": "reviewer"}
    )
    assert response.status_code == 302
    assert Membership.objects.filter(team=pay.team, user=org, role="reviewer").exists()
    # Lowering one's own roles stays allowed.
    Membership.objects.create(team=pay.team, user=admin, role="auditor")
    response = pay.client("admin").post(
        f"/teams/{pay.team.pk}/members/remove", {"user": admin.username, "role": "auditor"}
    )
    assert response.status_code == 302
    assert not Membership.objects.filter(team=pay.team, user=admin, role="auditor").exists()
