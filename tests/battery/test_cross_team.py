"""E5: E4 across teams. Two teams, each with an agent that asked, a session grant, an MCP
server, and a reviewer, an auditor and an admin: every URL of the URLconf, called (GET
and POST) by each member of one team with the other team's ids, shows nothing of the
other team and changes nothing of it; and the organization's roles see both (issue 33)."""

from __future__ import annotations

from tests.battery import figures
from tests.teams.test_cross_team import body, walk
from tests.teams.world import TEAM_ROLES, make_team, org_client, unchanged


def test_e5_no_page_shows_or_changes_another_teams_agents_sessions_or_asks(db: None) -> None:
    pay, infra = make_team("pay"), make_team("infra")
    tried, shown, changed = 0, [], []
    for one, other in ((infra, pay), (pay, infra)):
        for role in TEAM_ROLES:
            n, leaks = walk(one.client(role), other, one)
            tried += n
            shown += [f"{role} of {one.team.name}: {leak}" for leak in leaks]
            changed += [f"{role} of {one.team.name}: {c}" for c in unchanged(other)]
    org_missing = []
    for role, url in (
        ("reviewer", "/approvals/"),
        ("auditor", "/audit/sessions/"),
        ("admin", "/agents/"),
    ):
        page = body(org_client(role).get(url))
        for world in (pay, infra):
            if not any(m in page for m in world.markers):
                org_missing.append(f"{role} {url}: nothing of {world.team.name}")
    figures.record(
        "E5",
        "another team's pages reachable by a team's reviewer/auditor/admin (shown or changed)",
        f"{len(shown) + len(changed)} of {tried} requests",
        "0",
        not shown and not changed,
        shown=shown[:40],
        changed=changed[:40],
    )
    figures.record(
        "E5",
        "organization roles' pages missing a team",
        len(org_missing),
        "0",
        not org_missing,
        missing=org_missing,
    )
    assert tried >= 300
    assert not shown and not changed, (shown, changed)
    assert not org_missing, org_missing
