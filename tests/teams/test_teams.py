"""Teams: made, joined and left by command, each change audited; an agent works for one
team; a role held in a team opens its pages and reaches that team only (teams.scope)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from audit import roles
from audit.models import AuditEvent
from dispatcher import agents
from dispatcher.models import Agent
from teams.models import Membership, Team
from teams.scope import scope_of
from teams.services import TeamError, add_member, create_team, remove_member
from tests.support.factories import make_agent, make_user

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_a_team_is_made_joined_and_left_by_command_and_each_change_is_audited() -> None:
    make_user("rita")
    assert run("create_team", "payments") == "Created team 'payments'.\n"
    assert "rita is now reviewer of team 'payments'" in run(
        "add_member", "payments", "rita", "--role", "reviewer"
    )
    assert "already reviewer" in run("add_member", "payments", "rita", "--role", "reviewer")
    rita = User.objects.get(username="rita")
    assert roles.has_role(rita, "reviewer") and not roles.has_role(rita, "auditor")
    assert roles.roles_of(rita) == {"reviewer"}
    assert "no longer reviewer" in run("remove_member", "payments", "rita", "--role", "reviewer")
    assert not roles.has_role(rita, "reviewer")
    assert list(
        AuditEvent.objects.filter(kind__startswith="team.")
        .order_by("id")
        .values_list("kind", "payload__user", "payload__role")
    ) == [
        ("team.created", None, None),
        ("team.member_added", "rita", "reviewer"),
        ("team.member_removed", "rita", "reviewer"),
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("create_team", "bad name!"), "A team name is 1-63 letters"),
        (("add_member", "nope", "rita", "--role", "reviewer"), "No team named 'nope'"),
        (("add_member", "payments", "ghost", "--role", "reviewer"), "No user named 'ghost'"),
    ],
)
def test_bad_input_gets_a_specific_error(args: tuple[str, ...], message: str) -> None:
    make_user("rita")
    create_team(name="payments", actor="test")
    with pytest.raises(CommandError, match=message):
        run(*args)


def test_a_second_team_with_the_same_name_in_other_case_is_refused() -> None:
    create_team(name="payments", actor="test")
    with pytest.raises(TeamError, match="exists already"):
        create_team(name="Payments", actor="test")


def test_an_agent_works_for_the_team_named_and_must_name_one_once_there_are_two() -> None:
    make_user("olga")
    out = run("create_agent", "first", "--owner", "olga")
    assert "team 'default'" in out
    assert Agent.objects.get(name="first").team == Team.objects.default()
    create_team(name="payments", actor="test")
    with pytest.raises(CommandError, match="Name the agent's team with --team"):
        run("create_agent", "second", "--owner", "olga")
    make_user("sam")
    run("create_agent", "second", "--owner", "olga", "--team", "payments", "--sponsor", "sam")
    agent = Agent.objects.get(name="second")
    assert (agent.team.name, agent.sponsor.username) == ("payments", "sam")
    event = AuditEvent.objects.filter(kind="agent.created").latest("id")
    assert (event.payload["team"], event.payload["sponsor"]) == ("payments", "sam")


def test_a_change_of_owner_team_or_sponsor_is_audited_with_before_and_after() -> None:
    fx = make_agent()
    payments = create_team(name="payments", actor="test")
    new_owner = make_user("nora")
    assert agents.transfer_agent(agent=fx.agent, owner=new_owner, team=payments, actor="admin")
    assert not agents.transfer_agent(agent=fx.agent, team=payments, actor="admin")
    event = AuditEvent.objects.get(kind="agent.transferred")
    assert event.payload["before"]["team"] == "default"
    assert event.payload["after"] == {"owner": "nora", "team": "payments", "sponsor": None}
    assert event.actor == "admin"


def test_a_team_role_reaches_its_team_and_an_organization_role_reaches_every_team() -> None:
    payments, infra = (create_team(name=n, actor="test") for n in ("payments", "infra"))
    rita, otto = make_user("rita"), make_user("otto", groups=("reviewer",))
    add_member(team=payments, user=rita, role="reviewer", actor="test")
    add_member(team=infra, user=rita, role="auditor", actor="test")
    reach = scope_of(rita, "reviewer")
    assert reach.covers(payments.pk) and not reach.covers(infra.pk)
    assert scope_of(rita, "auditor").team_ids == {infra.pk}
    assert scope_of(rita, "admin").empty
    assert scope_of(otto, "reviewer").everything
    rita.is_active = False
    rita.save()
    assert scope_of(rita, "reviewer").empty and not roles.has_role(rita, "reviewer")


def test_removing_by_source_leaves_a_role_given_by_hand() -> None:
    team = create_team(name="payments", actor="test")
    rita = make_user("rita")
    add_member(team=team, user=rita, role="reviewer", actor="test")
    assert not remove_member(team=team, user=rita, role="reviewer", actor="sso", source="sso")
    assert Membership.objects.filter(user=rita, role="reviewer").exists()
