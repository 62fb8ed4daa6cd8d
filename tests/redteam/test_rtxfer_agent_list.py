"""The agent list (/agents/) counts an agent's sessions and shows when its last one
started: only of the sessions of teams its reader reaches (AgentSession.team), as the
agent's own page does. An agent moved from pay to infra showed infra's admin how many
sessions it had run for pay, and when the last began."""

from __future__ import annotations

import re

import pytest

from dispatcher import agents
from tests.support.factories import make_user, unique
from tests.teams.test_cross_team import body
from tests.teams.test_transfer_sessions import person
from tests.teams.world import make_team

db = pytest.mark.django_db


def row_of(page: str, name: str) -> str:
    """The table row of the agent named `name`."""
    rows = re.findall(r"<tr[^>]*>.*?</tr>", page, flags=re.S)
    found = [row for row in rows if f">{name}</a>" in row]
    assert len(found) == 1, page
    return found[0]


def cells(row: str) -> list[str]:
    return [
        re.sub(r"<[^>]+>", "", cell).strip()
        for cell in re.findall(r"<td>(.*?)</td>", row, flags=re.S)
    ]


@db
def test_the_new_teams_admin_is_not_told_of_the_former_teams_sessions() -> None:
    pay, infra = make_team("pay"), make_team("infra")
    agent = pay.agent.agent
    for _ in range(2):
        agents.start_session(agent=agent)  # three sessions of pay's in all
    assert agents.transfer_agent(agent=agent, team=infra.team, actor="test")

    listing = person(infra.members["admin"]).get("/agents/")
    assert listing.status_code == 200
    row = cells(row_of(body(listing), agent.name))
    # Sessions: none of infra's yet (before: 3, pay's), and never a session of infra's.
    assert row[4] == "0", row
    assert row[5] == "never", row
    page = body(person(infra.members["admin"]).get(f"/agents/{agent.pk}/"))
    assert "<dt>Sessions</dt><dd>0</dd>" in page

    # Its next session is infra's: counted.
    agents.start_session(agent=agent)
    row = cells(row_of(body(person(infra.members["admin"]).get("/agents/")), agent.name))
    assert row[4] == "1" and row[5] != "never", row

    # An organization admin reads them all.
    org = person(make_user(unique("org-admin"), groups=("admin",)))
    row = cells(row_of(body(org.get("/agents/")), agent.name))
    assert row[4] == "4", row
