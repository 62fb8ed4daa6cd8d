"""Red-team attacks across teams (issue 33): a person in two teams is the bridge; what a
team's admin, reviewer or auditor reaches through them."""

from __future__ import annotations

import pytest

from teams.services import add_member
from tests.teams.world import TeamWorld, make_team

pytestmark = pytest.mark.django_db


@pytest.fixture
def teams() -> tuple[TeamWorld, TeamWorld]:
    pay, infra = make_team("pay"), make_team("infra")
    # infra's agent's owner is also in pay: pay's admin manages their rules.
    add_member(team=pay.team, user=infra.agent.owner, role="auditor", actor="test")
    return pay, infra


def test_a_backtest_by_a_team_admin_reads_no_call_of_another_teams_agent(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    pay, infra = teams
    owner = infra.agent.owner
    admin = pay.client("admin")
    page = admin.get(f"/permissions/users/{owner.pk}/")
    assert page.status_code == 403 and infra.secret not in page.content.decode()
    # Rules under which the other team's ask (a write_file) would be denied: the owner is
    # also in infra, so pay's admin neither reads nor backtests their rules.
    answer = admin.post(
        f"/permissions/users/{owner.pk}/backtest",
        {"mode": "standard", "allow": "", "ask": "", "deny": "write_file"},
    )
    assert answer.status_code == 403
    assert infra.secret not in answer.content.decode()
    # The organization's admin, who reaches infra, sees it change.
    from tests.teams.world import org_client

    org = org_client("admin").post(
        f"/permissions/users/{owner.pk}/backtest",
        {"mode": "standard", "allow": "", "ask": "", "deny": "write_file"},
    )
    assert infra.secret in org.content.decode()


NPM_RULE = "run_command(npm test *)"


def test_a_team_admins_suggestions_are_for_their_own_people_and_backtest_their_calls() -> None:
    from django.conf import settings

    from dispatcher import agents, analytics
    from dispatcher.models import Agent, AgentSession
    from teams.scope import Scope
    from teams.services import create_team
    from tests.dashboard.test_analytics import NPM, History
    from tests.support.factories import unique

    pay = create_team(name=unique("pay"), actor="test")
    infra = create_team(name=unique("infra"), actor="test")
    history = History()
    Agent.objects.filter(pk=history.fx.agent.pk).update(team=pay)
    AgentSession.objects.filter(pk=history.session.pk).update(team=pay)  # (pay's history)
    for i in range(20):
        history.decide("run_command", NPM, "alice", True, 8 + i % 5)
    owner = history.save()
    pay_only = Scope(everything=False, team_ids=frozenset({pay.pk}))
    [npm] = [s for s in analytics.report(reach=pay_only)["suggestions"] if s.rule == NPM_RULE]
    assert {c.call.session.agent.team_id for c in npm.backtest.changes} == {pay.pk}
    assert len(npm.backtest.changes) == 20
    # The same person's agent in infra made a call the suggested rule would change: the
    # person is no longer pay's admin's to manage (their rules govern infra's agent too),
    # so pay's page suggests nothing for them (not even whether the rule exists, or their
    # profile's version); the organization's page backtests both teams' calls.
    other, _ = agents.create_agent(owner=owner, name=unique("infra-agent"), team=infra, actor="t")
    elsewhere = History()
    elsewhere.fx = type(history.fx)(other, "", owner)
    elsewhere.session = AgentSession.objects.create(
        agent=other,
        team_id=other.team_id,
        mode="standard",
        workspace=str(settings.HARNESS_WORKSPACE_ROOT),
    )
    elsewhere.decide("run_command", {"argv": ["npm", "test", "--", "infra-secret"]}, "x", True, 9)
    elsewhere.save()

    mine = analytics.report(reach=pay_only)
    assert [p.rule for p in mine["patterns"]] == [NPM_RULE]  # pay's calls, still counted
    assert mine["suggestions"] == []
    everything = analytics.report()
    [npm] = [s for s in everything["suggestions"] if s.rule == NPM_RULE]
    assert len(npm.backtest.changes) == 21


def test_a_team_admin_cannot_loosen_another_teams_agent_by_adding_its_owner_to_their_team() -> None:
    from dispatcher.policy.profiles import profile_for
    from tests.teams.world import org_client

    pay, infra = make_team("pay"), make_team("infra")
    owner = infra.agent.owner
    admin = pay.client("admin")
    # Any team admin may add anyone to their own team...
    added = admin.post(
        f"/teams/{pay.team.pk}/members/add", {"user": owner.username, "role": "auditor"}
    )
    assert added.status_code == 302
    before = profile_for(owner)
    # ...but does not thereby manage the rules that govern that person's agents in infra.
    loosened = {"mode": "trusted", "allow": "write_file", "ask": "", "deny": "", "version": ""}
    answer = admin.post(f"/permissions/users/{owner.pk}/", loosened)
    assert answer.status_code == 403
    assert "only an organization admin" in answer.content.decode()
    after = profile_for(owner)
    assert (after.mode, after.version) == (before.mode, before.version)
    applied = admin.post(
        "/permissions/analytics/apply",
        {"user": owner.pk, "rule": "write_file", "action": "allow", "version": before.version},
    )
    assert applied.status_code == 403 and profile_for(owner).version == before.version
    # Nor reads them (they say what infra's agent runs and allows).
    page = admin.get(f"/permissions/users/{owner.pk}/")
    assert page.status_code == 403 and infra.secret not in page.content.decode()
    # A person in pay alone is pay's admin's to change; the organization's admin changes any.
    own = pay.members["reviewer"]
    assert admin.post(f"/permissions/users/{own.pk}/", loosened).status_code == 302
    assert org_client("admin").post(f"/permissions/users/{owner.pk}/", loosened).status_code == 302
    assert profile_for(owner).mode == "trusted"


def test_a_team_admin_makes_no_agent_owned_by_another_teams_person_or_an_org_role() -> None:
    from dispatcher.models import Agent
    from tests.support.factories import make_user, unique
    from tests.teams.world import org_client

    pay, infra = make_team("pay"), make_team("infra")
    admin = pay.client("admin")
    boss = make_user(unique("org-admin"), groups=("admin",))
    for outsider in (infra.agent.owner, infra.members["reviewer"], boss):
        # Even once added to the admin's own team, their rules are not the team's to lend.
        add_member(team=pay.team, user=outsider, role="auditor", actor="test")
        name = unique("borrowed")
        answer = admin.post(
            "/agents/", {"name": name, "owner": outsider.username, "team": pay.team.name}
        )
        assert answer.status_code == 400, outsider
        assert "only an organization admin makes agents they own" in answer.content.decode()
        assert not Agent.objects.filter(name=name).exists()
    mine = admin.post(
        "/agents/",
        {"name": "own", "owner": pay.members["reviewer"].username, "team": pay.team.name},
    )
    assert mine.status_code == 200
    org = org_client("admin").post(
        "/agents/", {"name": "lent", "owner": boss.username, "team": pay.team.name}
    )
    assert org.status_code == 200


def test_a_team_admin_gives_no_agent_a_fixed_workspace_on_the_host() -> None:
    """A team admin chose any host directory as an agent's workspace (/etc/profile.d, another
    team's fixed workspace): the sandbox user got it and the agent wrote there."""
    from dispatcher.models import Agent

    pay = make_team("pay")
    admin = pay.client("admin")
    owner = pay.members["reviewer"].username
    for where in ("/etc/profile.d", "/srv/agents/another-teams-ci"):
        answer = admin.post(
            "/agents/", {"name": "fixed", "owner": owner, "team": pay.team.name, "workspace": where}
        )
        assert answer.status_code == 400
        assert "Only an organization admin gives an agent a fixed workspace" in (
            answer.content.decode()
        )
        assert not Agent.objects.filter(name="fixed").exists()
    fresh = admin.post("/agents/", {"name": "fresh", "owner": owner, "team": pay.team.name})
    assert fresh.status_code == 200 and Agent.objects.get(name="fresh").workspace == ""
