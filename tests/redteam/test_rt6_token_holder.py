"""Separation of duties counts the person an agent's bearer token was shown to (found by
the rt6 red team). With HARNESS_FORBID_SELF_APPROVAL, an organization admin who is also
a reviewer could create an agent for someone else in the dashboard, keep the token shown
once, run calls as the agent and approve them: only the owner, the sponsor and an OAuth
agent's signer were left out. Everyone a token of the agent was shown to (who created it
or rotated its token in the dashboard) now counts as behind it, after a later rotation
too (rt10: the calls made with the old token still wait)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dispatcher.models import Agent, Status, ToolCall
from tests.approvals.conftest import ask
from tests.support.factories import AgentFixture, make_user, unique

pytestmark = pytest.mark.django_db

TOKEN = re.compile(r"hrn_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")


def admin(prefix: str) -> tuple[User, Client]:
    person = make_user(unique(prefix), groups=("admin", "reviewer"))
    client = Client()
    client.force_login(person)
    return person, client


def decide(client: Client, approval: Any) -> Any:
    return client.post(
        f"/approvals/{approval.pk}/decide",
        {"action": "approve", "digest": approval.call.digest},
    )


def test_the_person_shown_an_agents_token_cannot_approve_its_calls(settings: Any) -> None:
    settings.HARNESS_FORBID_SELF_APPROVAL = True
    owner = make_user(unique("owner"), mode="standard")
    maker, maker_client = admin("maker")
    made = maker_client.post("/agents/", {"name": unique("agent"), "owner": owner.username})
    assert made.status_code == 200, made.content
    [token] = set(TOKEN.findall(made.content.decode()))
    agent = Agent.objects.get(owner=owner)
    fx = AgentFixture(agent, token, owner)

    approval = ask(fx, {"path": "a.txt", "content": "x"})
    refused = decide(maker_client, approval)
    assert refused.status_code == 403, refused.content
    assert "You are a person who was shown a token of this agent" in refused.content.decode()
    assert ToolCall.objects.get(pk=approval.call_id).status == Status.PENDING_APPROVAL

    # Another admin rotates the token: they hold it now, and the maker's copy is dead;
    # the maker still approves none of the agent's calls, the one they made with their
    # copy before the rotation included (rt10), and neither does the rotator.
    rotator, rotator_client = admin("rotator")
    rotated = rotator_client.post(f"/agents/{agent.pk}/rotate")
    assert rotated.status_code == 200, rotated.content
    [new_token] = set(TOKEN.findall(rotated.content.decode()))
    second = ask(AgentFixture(agent, new_token, owner), {"path": "b.txt", "content": "y"})
    for pending in (approval, second):
        pending.refresh_from_db()
        assert decide(rotator_client, pending).status_code == 403
        assert decide(maker_client, pending).status_code == 403
    _, other_client = admin("other")
    assert decide(other_client, second).status_code in (200, 302)
    assert ToolCall.objects.get(pk=second.call_id).status != Status.PENDING_APPROVAL
