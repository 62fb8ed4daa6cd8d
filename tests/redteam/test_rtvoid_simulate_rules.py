"""Red team (rtvoid) of rtteam's fix "a team admin's rule checks name no tool of another
team's server": the simulator also checks the form's rules (the rules tried before they
are saved), and it checked them against the registry, every team's tools. A team admin
simulating with a rule naming an unknown tool read another team's server names in
"(known tools: ...)", and a rule naming another team's tool was accepted where an
unknown one was not. They are checked against the tools of the admin's teams, as the
rows' check and the save are."""

from __future__ import annotations

from typing import Any

import pytest

from tests.teams.world import make_team


def simulated_with(client: Any, subject: Any, allow: str, what: str = "simulate") -> str:
    response = client.post(
        f"/permissions/users/{subject.pk}/{what}",
        {
            "tool": "read_file",
            "arguments": '{"path": "a"}',
            "mode": "standard",
            "allow": allow,
            "ask": "",
            "deny": "",
        },
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200, response.content[:300]
    return response.content.decode()


@pytest.mark.django_db
def test_a_team_admins_simulation_of_proposed_rules_names_no_tool_of_another_team() -> None:
    pay, infra = make_team("pay"), make_team("infra")
    subject = pay.members["reviewer"]
    admin = pay.client("admin")
    unknown = simulated_with(admin, subject, "no_such_tool")
    assert "unknown tool" in unknown and pay.tool.exposed_name in unknown
    assert infra.server.name not in unknown  # before: every team's servers' tools listed
    other = simulated_with(admin, subject, infra.tool.exposed_name)
    assert f"unknown tool &#x27;{infra.tool.exposed_name}&#x27;" in other  # before: accepted
    # The backtest of the form's rules checks them alike.
    unknown = simulated_with(admin, subject, "no_such_tool", "backtest")
    assert "unknown tool" in unknown and infra.server.name not in unknown
