"""rtfresh: a notification channel routes asks by agent *name* ("agents": docs/teams.md
advises a team its own webhook or Slack channel naming that team's agents), but an
agent's name is unique per owner only, and an OAuth client chooses its own agent's name
(agentauth.services.client_name). Another team's agent named like one of the team's gets
its asks, what they would run and all, delivered to that team's channel.

A route names an agent with its team now (`team/name`, or `team/*` for all of a team's
agents: approvals.notifications.services.names_agent), which a team's channel uses; a bare
name still names an agent of that name in any team (docs/notifications.md says so)."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from approvals.notifications import services as notifications
from approvals.notifications.models import Channel, Delivery, Kind
from dispatcher import agents
from tests.support.factories import make_user, submit_one, unique
from tests.teams.world import make_team

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("named", ["{team}/{agent}", "{team}/*"])
def test_a_teams_channel_gets_no_ask_of_another_teams_agent_of_the_same_name(named: str) -> None:
    pay, infra = make_team("pay"), make_team("infra")
    route = named.format(team=pay.team.name, agent=pay.agent.agent.name)
    channel = Channel.objects.create(
        name=unique("pay-hook"),
        kind=Kind.WEBHOOK,
        config={"url": "https://hooks.example.com/pay", "secret": "s" * 32},
        match_agents=[route],
    )
    owner = make_user(unique("infra-person"), mode="standard")
    twin, _ = agents.create_agent(
        owner=owner, name=pay.agent.agent.name, actor="test", team=infra.team
    )
    call = submit_one(
        agents.start_session(agent=twin), "write_file", {"path": "infra-only.txt", "content": "x"}
    )
    asked = ApprovalRequest.objects.get(call=call)
    notifications.plan_ask(asked.pk)
    assert not Delivery.objects.filter(channel=channel, approval=asked).exists()
    # (and the team's own agent's asks still reach it)
    own = submit_one(
        agents.start_session(agent=pay.agent.agent),
        "write_file",
        {"path": "pay-only.txt", "content": "x"},
    )
    ours = ApprovalRequest.objects.get(call=own)
    notifications.plan_ask(ours.pk)
    assert Delivery.objects.filter(channel=channel, approval=ours).exists()


def test_a_bare_name_names_an_agent_of_that_name_in_any_team() -> None:
    """What a bare name did before, kept (a channel made for one agent whatever its team):
    docs/notifications.md tells a team's channel to name its agents with the team."""
    assert notifications.names_agent(["deployer"], "deployer", "infra")
    assert not notifications.names_agent(["pay/deployer"], "deployer", "infra")
    assert notifications.names_agent(["pay/deployer"], "deployer", "pay")
    assert notifications.names_agent(["pay/*"], "anything", "pay")
    assert not notifications.names_agent(["pay/*"], "pay/x", "infra")  # (a name with a slash)
