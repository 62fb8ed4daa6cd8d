"""rtfresh: a notification channel routes asks by agent *name* ("agents": docs/teams.md
advises a team its own webhook or Slack channel naming that team's agents), but an
agent's name is unique per owner only, and an OAuth client chooses its own agent's name
(agentauth.services.client_name). Another team's agent named like one of the team's gets
its asks, what they would run and all, delivered to that team's channel.

Not fixed here (a design choice: the channel's "agents" would have to name agents by id,
or by team and name, and the page and the environment channels with them): left
xfail(strict=True) for the lead."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from approvals.notifications import services as notifications
from approvals.notifications.models import Channel, Delivery, Kind
from dispatcher import agents
from tests.support.factories import make_user, submit_one, unique
from tests.teams.world import make_team

pytestmark = pytest.mark.django_db


@pytest.mark.xfail(
    strict=True,
    reason="channels match agents by name, which is unique per owner only (rtfresh)",
)
def test_a_teams_channel_gets_no_ask_of_another_teams_agent_of_the_same_name() -> None:
    pay, infra = make_team("pay"), make_team("infra")
    channel = Channel.objects.create(
        name=unique("pay-hook"),
        kind=Kind.WEBHOOK,
        config={"url": "https://hooks.example.com/pay", "secret": "s" * 32},
        match_agents=[pay.agent.agent.name],
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
