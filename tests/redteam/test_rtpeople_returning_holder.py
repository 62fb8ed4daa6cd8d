"""Red team of the leavers' tokens: a rotation after someone left forgot that they had
held the agent's token, so separation of duties forgot it too.

With HARNESS_FORBID_SELF_APPROVAL, everyone a bearer token of an agent was shown to stays
behind it for good (rt6, rt10: the calls made with an old token still wait after a
rotation). The leavers' change made rotate_token drop the holders who are no longer
active. A reviewer who made an agent in the dashboard and asked calls with its token,
then left (their token voided), and came back (their account made active again, as
docs/identity.md allows for: "even if the account comes back"), after an admin rotated
the voided token, approved the very call they had made with their own copy. Holders now
stay listed after a rotation, active or not.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit import roles
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


def approve(client: Client, approval: Any) -> Any:
    return client.post(
        f"/approvals/{approval.pk}/decide",
        {"action": "approve", "digest": approval.call.digest},
    )


def test_a_holder_who_left_and_came_back_cannot_approve_the_call_they_made(
    settings: Any,
) -> None:
    settings.HARNESS_FORBID_SELF_APPROVAL = True
    owner = make_user(unique("owner"), mode="standard")
    maker, maker_client = admin("maker")
    made = maker_client.post("/agents/", {"name": unique("agent"), "owner": owner.username})
    assert made.status_code == 200, made.content
    [token] = set(TOKEN.findall(made.content.decode()))
    agent = Agent.objects.get(owner=owner)
    first = ask(AgentFixture(agent, token, owner), {"path": "a.txt", "content": "x"})
    assert approve(maker_client, first).status_code == 403  # their own call

    assert roles.deactivate(user=maker, actor="user:root")  # the token is voided
    first.call.refresh_from_db()
    assert first.call.status == Status.CANCELLED  # (its calls waiting for a reviewer too)
    _, rotator_client = admin("rotator")
    rotated = rotator_client.post(f"/agents/{agent.pk}/rotate")
    assert rotated.status_code == 200
    [token] = set(TOKEN.findall(rotated.content.decode()))
    maker.is_active = True  # they come back (the account made active again)
    maker.save()
    # A call asked with the rotated token: the maker may still hold a copy of an older
    # token of the agent (Harness cannot tell which token sent a call), so it is theirs too.
    approval = ask(AgentFixture(agent, token, owner), {"path": "b.txt", "content": "y"})

    back = Client()
    back.force_login(maker)
    refused = approve(back, approval)
    assert refused.status_code == 403, refused.content  # before: approved
    assert "You are a person who was shown a token of this agent" in refused.content.decode()
    assert ToolCall.objects.get(pk=approval.call_id).status == Status.PENDING_APPROVAL
