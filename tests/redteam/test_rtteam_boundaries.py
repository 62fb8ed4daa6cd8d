"""rtteam: a signed-in person with a limited role (a team's reviewer, auditor or admin)
attacks the team boundaries through real requests (Django's test client over the real
URLconf, PostgreSQL and Redis as configured). Each test is a way past a boundary that
was open, reproduced before its fix."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages

from dispatcher.policy import managed
from dispatcher.tools.sources.models import McpServer, ServerVersion
from tests.teams.world import TeamWorld, make_team, org_client

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


@db
def test_a_team_admin_reusing_a_server_name_sees_nothing_of_the_removed_servers_history(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    """Server names are the organization's: once another team removed its server, a team
    admin may register one of the same name. /tools/'s "Recent changes" showed a team admin
    every version recorded under the names of their servers, so they read the other team's
    removed server's history (who added, refreshed and removed it, and when). A team
    admin's page shows the versions of their own servers only: those recorded since the
    server of that name was registered."""
    pay, infra = teams
    name = pay.server.name
    removed = pay.client("admin").post(f"/tools/servers/{name}/remove")
    assert removed.status_code == 302 and not McpServer.objects.filter(name=name).exists()
    assert ServerVersion.objects.filter(
        server_name=name, actor__contains=pay.members["admin"].username
    ).exists()
    # infra's admin registers a server of the same name (as the form would, for their team).
    McpServer.objects.create(
        name=name, transport="http", url="https://example.com/mcp", created_by="x", team=infra.team
    )
    page = infra.client("admin").get("/tools/").content.decode()
    assert name in page  # their own server is listed
    assert pay.members["admin"].username not in page
    # An organization admin reads the whole history.
    everything = org_client("admin").get("/tools/").content.decode()
    assert pay.members["admin"].username in everything


def simulated(client: Any, subject: Any, tool: str, arguments: str) -> str:
    response = client.post(
        f"/permissions/users/{subject.pk}/simulate",
        {"tool": tool, "arguments": arguments},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200, response.content[:300]
    return response.content.decode()


@db
def test_a_team_admins_simulation_names_no_tool_of_another_teams_server(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    """A typed simulation (no session) resolved the tool as no agent's: every team's MCP
    servers' tools were tools of it, so a team admin simulating for one of their people
    read another team's server and tool names in "Available tools: ..." (and had its tool
    decided as one that exists). It resolves the tool as an agent of the person's team
    in the admin's reach does."""
    pay, infra = teams
    subject = pay.members["reviewer"]  # wholly inside pay, no agent of their own
    admin = pay.client("admin")
    unknown = simulated(admin, subject, "no_such_tool", "{}")
    assert "does not exist" in unknown
    assert pay.tool.exposed_name in unknown  # their own team's server's tool is listed
    assert infra.server.name not in unknown
    other = simulated(admin, subject, infra.tool.exposed_name, '{"text": "hi"}')
    assert f"Tool &#x27;{infra.tool.exposed_name}&#x27; does not exist" in other
    assert infra.server.name not in other.split("Available tools:")[1]


@db
def test_a_team_admins_simulation_is_decided_under_their_teams_layer_not_the_default_teams(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    """For a person who owns no agent, a simulation was decided under the default team's
    layer: a team admin (of another team) read that team's rules in the answer ("Rule ...
    in team default's ask list"). It is decided under the layer of the person's team in
    the admin's reach."""
    from teams.models import Team

    pay, _infra = teams
    default = Team.objects.default()
    secret = "run_command(default-team-secret *)"
    managed.set_layer(team=default, document={"ask": [secret]}, actor="cli")
    pay_rule = "run_command(pay-team-rule *)"
    managed.set_layer(team=pay.team, document={"deny": [pay_rule]}, actor="cli")
    subject = pay.members["reviewer"]
    admin = pay.client("admin")
    page = simulated(admin, subject, "run_command", '{"argv": ["default-team-secret", "go"]}')
    assert "default-team-secret *" not in page and f"team {default.name}" not in page
    # The person's own team's layer binds it.
    page = simulated(admin, subject, "run_command", '{"argv": ["pay-team-rule", "go"]}')
    assert "pay-team-rule *" in page and f"team {pay.team.name}" in page


@db
def test_a_team_admins_rule_checks_name_no_tool_of_another_teams_server(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    """A rule naming an unknown tool was refused "(known tools: ...)" with every team's MCP
    servers' tools, on the rows' check, on saving and on applying a suggestion: a team
    admin read another team's server names there (and a rule naming another team's tool
    was accepted where an unknown one was not). They are checked against the tools of the
    admin's teams."""
    pay, infra = teams
    subject = pay.members["reviewer"]
    admin = pay.client("admin")
    rows = {"rule_action": ["allow"], "rule_tool": ["no_such_tool"], "rule_spec": [""]}
    checked = admin.post(
        f"/permissions/users/{subject.pk}/check", rows, headers={"HX-Request": "true"}
    ).content.decode()
    assert "unknown tool" in checked and pay.tool.exposed_name in checked
    assert infra.server.name not in checked
    version = subject.permission_profile.version if hasattr(subject, "permission_profile") else ""
    saved = admin.post(
        f"/permissions/users/{subject.pk}/",
        {"mode": "standard", "allow": "no_such_tool", "ask": "", "deny": "", "version": version},
    )
    assert saved.status_code == 400
    assert "unknown tool" in saved.content.decode()
    assert infra.server.name not in saved.content.decode()
    # Another team's tool is as unknown as a tool that does not exist.
    rows["rule_tool"] = [infra.tool.exposed_name]
    checked = admin.post(
        f"/permissions/users/{subject.pk}/check", rows, headers={"HX-Request": "true"}
    ).content.decode()
    assert f"unknown tool &#x27;{infra.tool.exposed_name}&#x27;" in checked


@db
def test_an_agents_page_shows_a_team_admin_no_mode_of_an_owner_they_do_not_manage(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    """A team admin reads the rules (mode and lists) of people wholly inside their teams
    only; the agent's page showed the owner's mode whoever the owner was (someone also in
    another team, whose mode governs that team's agents too)."""
    from dispatcher.policy import profiles
    from teams.services import add_member, remove_member

    pay, infra = teams
    owner = pay.agent.owner
    add_member(team=infra.team, user=owner, role="auditor", actor="test")
    profiles.set_mode(user=owner, mode="trusted", actor="test")
    page = pay.client("admin").get(f"/agents/{pay.agent.agent.pk}/").content.decode()
    facts = page.split("Owner's mode", 1)[1].split("</dd>", 1)[0]
    assert "trusted" not in facts and "an organization admin reads their rules" in facts
    # Their own people's mode is shown, and an organization admin sees every owner's.
    everything = org_client("admin").get(f"/agents/{pay.agent.agent.pk}/").content.decode()
    assert "trusted" in everything.split("Owner's mode", 1)[1].split("</dd>", 1)[0]
    remove_member(team=infra.team, user=owner, role="auditor", actor="test")
    own = pay.client("admin").get(f"/agents/{pay.agent.agent.pk}/").content.decode()
    assert "trusted" in own.split("Owner's mode", 1)[1].split("</dd>", 1)[0]


@db
def test_an_escalated_ask_shows_the_next_tier_no_reason_of_the_sessions_earlier_calls(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    """Escalation offers the next tier's reviewers one ask. Its "Session context" listed the
    session's earlier calls with who decided them and why, so a reviewer of the next team
    read the agent's team's rules there ("Rule 'read_file(pay-private-*)' in team pay's
    deny list"), on the queue, the call's page and a one-tap link's page. They see the
    earlier calls' tools and outcomes only; the agent's team's reviewers see everything."""
    from datetime import timedelta

    from django.utils import timezone

    from approvals import links
    from approvals import services as approvals
    from approvals.models import ApprovalRequest
    from teams.services import set_escalation
    from tests.support.factories import submit_one

    pay, infra = teams
    managed.set_layer(team=pay.team, document={"deny": ["read_file(pay-private-*)"]}, actor="cli")
    earlier = submit_one(
        pay.session, "read_file", {"path": "pay-private-plan.txt"}, tool_use_id="h1"
    )
    assert earlier.status == "denied"
    later = submit_one(
        pay.session, "write_file", {"path": "later.txt", "content": "x"}, tool_use_id="h2"
    )
    set_escalation(team=pay.team, after=1, to=infra.team, actor="test")
    assert approvals.escalate_due(timezone.now() + timedelta(seconds=30))
    ask = ApprovalRequest.objects.get(call=later)
    link = links.make_url(ask, infra.members["reviewer"], "approve").split("://", 1)[1]
    next_tier = infra.client("reviewer")
    for url in ("/approvals/", f"/approvals/{ask.pk}/", f"/{link.split('/', 1)[1]}"):
        page = next_tier.get(url).content.decode()
        assert "Session context" in page and "read_file" in page, url
        assert "pay-private" not in page, url
    # The agent's team's reviewer reads the reasons.
    own = pay.client("reviewer").get(f"/approvals/{ask.pk}/").content.decode()
    assert "read_file(pay-private-*)" in own


@db
def test_a_refresh_of_a_server_gone_meanwhile_names_no_other_server(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    """(rtteam's report: a refresh that lost a race with the server's removal answered with
    every registered server's name, the other teams' too.)"""
    from dispatcher.tools.sources import services
    from floor.errors import ServiceError

    pay, infra = teams
    with pytest.raises(ServiceError) as refused:
        services.refresh_server(name="gone-meanwhile", actor="user:x")
    assert str(refused.value) == "No MCP server named 'gone-meanwhile' is registered."
    assert pay.server.name not in str(refused.value)
