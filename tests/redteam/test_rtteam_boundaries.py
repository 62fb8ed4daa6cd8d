"""rtteam: a signed-in person with a limited role (a team's reviewer, auditor or admin)
attacks the team boundaries through real requests (Django's test client over the real
URLconf, PostgreSQL and Redis as configured). Each test is a way past a boundary that
was open, reproduced before its fix."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages

from dispatcher.policy import managed
from tests.teams.world import TeamWorld, make_team

db = pytest.mark.django_db


@pytest.fixture
def teams() -> tuple[TeamWorld, TeamWorld]:
    return make_team("pay"), make_team("infra")


def said(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


@db
def test_make_active_tells_a_team_admin_nothing_of_another_teams_layer(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    """/permissions/analytics/activate looked the rule up in the named layer before it
    checked who may change that layer: for another team's layer, "There is no log-only
    rule ... any more" when the team had no such rule and "Only an admin of team ..."
    when it had, so a team admin read another team's log-only rules (what it watches for)
    one guess at a time. Now another team's layer is not found, as a team that does not
    exist, whatever it holds."""
    pay, infra = teams
    secret = "run_command(deploy-pay-secret *)"
    managed.set_layer(
        team=pay.team,
        document={"ask": [{"rule": secret, "log_only": True}], "allow": [], "deny": []},
        actor="cli",
    )
    version = managed.layer_version(pay.team)
    answers = []
    for name, rule in (
        (pay.team.name, secret),
        (pay.team.name, "run_command(nothing-like-it *)"),
        ("no-such-team", secret),
    ):
        response = infra.client("admin").post(
            "/permissions/analytics/activate",
            {"layer": f"team:{name}", "action": "ask", "rule": rule},
        )
        assert response.status_code == 302
        answers.append([m.replace(name, "NAME") for m in said(response)])
    assert answers == [["No team named 'NAME'."]] * 3, answers
    assert managed.layer_version(pay.team) == version
    # The team's own admin makes it active.
    response = pay.client("admin").post(
        "/permissions/analytics/activate",
        {"layer": f"team:{pay.team.name}", "action": "ask", "rule": secret},
    )
    assert managed.layer_document(pay.team)["ask"] == [secret]
