"""Red team of the leavers' tokens: the notice that an agent's token was voided went to
every webhook and Slack channel, also one whose route names other agents only.

A channel's route (docs/notifications.md, "Route": its agents) keeps an agent's asks
off a channel meant for other agents (a vendor's Slack, another group's receiver). The
token-voided notice (agent.token_voided: the agent, its owner, its token's prefix and
who left) ignored it: a channel routed to `vendor-bot` heard of every internal agent
whose token a leaver's departure voided. Now a channel whose route names agents hears
only of those; one routed by tools or rules only, or not at all, hears of every agent.
"""

from __future__ import annotations

from typing import Any

import pytest

from audit import roles
from audit.models import AuditEvent
from dispatcher import agents
from tests.notifications import receivers
from tests.notifications.test_channels import SECRET, channel
from tests.support.factories import make_user, unique


@pytest.mark.django_db
def test_a_channel_routed_to_other_agents_does_not_hear_of_a_voided_token(
    settings: Any,
) -> None:
    from identity import notify

    settings.HARNESS_OUTBOUND_ALLOW = ["127.0.0.1"]
    leaver = make_user(unique("ada"), groups=("admin",))
    owner = make_user(unique("olga"), mode="standard")
    internal, _ = agents.create_agent(
        owner=owner, name=unique("billing"), actor="t", shown_to=leaver
    )
    assert roles.deactivate(user=leaver, actor="user:root")
    event = AuditEvent.objects.get(kind="agent.token_voided", subject=f"agent:{internal.pk}")
    with receivers.webhook_receiver(SECRET) as server:
        channel(
            "webhook",
            {"url": server.url + "/vendor", "secret": SECRET},
            match_agents=["vendor-bot"],
        )
        channel(
            "webhook", {"url": server.url + "/ours", "secret": SECRET}, match_agents=[internal.name]
        )
        channel("webhook", {"url": server.url + "/all", "secret": SECRET})
        team = internal.team.name
        channel(  # a route naming the agent with its team (names_agent)
            "webhook",
            {"url": server.url + "/team", "secret": SECRET},
            match_agents=[f"{team}/{internal.name}"],
        )
        channel(  # another team's agent of the same name: not this one
            "webhook",
            {"url": server.url + "/twin", "secret": SECRET},
            match_agents=[f"other-{team}/{internal.name}", f"{team}/someone-else"],
        )
        notify.notify_token_voided(event.pk)
        paths = sorted(received.path for received in server.received)
    assert paths == ["/all", "/ours", "/team"]  # before: "/vendor" too, naming billing and ada
