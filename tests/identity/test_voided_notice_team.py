"""The token-voided notice finds the agent's team, for a channel routed to `team/name`
(docs/notifications.md), in its event (agent.token_voided's `team`); an event written
before the event named it is routed by the team of the agent its subject names."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from audit import kinds, roles
from audit.models import AuditEvent
from audit.services import record_event
from dispatcher import agents
from tests.notifications import receivers
from tests.notifications.test_channels import SECRET, channel
from tests.support.factories import make_user, unique


def _voided() -> tuple[Any, AuditEvent]:
    """An agent whose token its only holder's deactivation voided, and that event."""
    leaver = make_user(unique("ada"), groups=("admin",))
    owner = make_user(unique("olga"), mode="standard")
    agent, _ = agents.create_agent(owner=owner, name=unique("billing"), actor="t", shown_to=leaver)
    assert roles.deactivate(user=leaver, actor="user:root")
    return agent, AuditEvent.objects.get(kind="agent.token_voided", subject=f"agent:{agent.pk}")


def _routed(agent: Any, event: AuditEvent) -> list[str]:
    """The channels the notice of `event` reached, of one routed to the agent's
    `team/name` and one to another team's agent of the same name."""
    from identity import notify

    with receivers.webhook_receiver(SECRET) as server:
        team = agent.team.name
        channel(
            "webhook",
            {"url": server.url + "/team", "secret": SECRET},
            match_agents=[f"{team}/{agent.name}"],
        )
        channel(
            "webhook",
            {"url": server.url + "/twin", "secret": SECRET},
            match_agents=[f"other-{team}/{agent.name}"],
        )
        notify.notify_token_voided(event.pk)
        return sorted(received.path for received in server.received)


@pytest.mark.django_db
def test_the_voided_event_names_the_agents_team_and_its_notice_is_routed_by_it(
    settings: Any,
) -> None:
    settings.HARNESS_OUTBOUND_ALLOW = ["127.0.0.1"]
    agent, event = _voided()
    assert event.payload["team"] == agent.team.name
    assert _routed(agent, event) == ["/team"]


@pytest.mark.django_db
def test_an_event_without_the_team_is_routed_by_the_agents_team(settings: Any) -> None:
    """An event as written before agent.token_voided named the team (the audit log is
    append-only: such events stay as they were written)."""
    settings.HARNESS_OUTBOUND_ALLOW = ["127.0.0.1"]
    owner = make_user(unique("olga"), mode="standard")
    agent, _ = agents.create_agent(owner=owner, name=unique("billing"), actor="t")
    with transaction.atomic():
        event = record_event(
            kind=kinds.AGENT_TOKEN_VOIDED,
            actor="user:root",
            subject=f"agent:{agent.pk}",
            payload={
                "name": agent.name,
                "owner": owner.username,
                "token_prefix": agent.token_prefix,
                "because": "ada",
                "reason": "ada, who was shown this token, was deactivated",
            },
        )
    assert _routed(agent, event) == ["/team"]
