"""A sign-in that ends takes its open sockets with it: signing out everywhere and an idle
sign-in ended by the beat close the approval queue's socket at once."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit.consumers import CLOSED_FOR_ACCESS
from identity import services
from tests.audit.test_socket_access import scenario
from tests.support.live import LiveStack

pytestmark = pytest.mark.live


def everywhere(client: Client, user: User) -> Any:
    return client.post("/accounts/sessions/everywhere/")


def idle_then_beat(client: Client, user: User) -> Any:
    client.get("/")  # a page request: the sign-in is on the person's list
    return services.end_stale_sign_ins(now=time.time() + 13 * 3600)


@pytest.mark.parametrize("how", [everywhere, idle_then_beat], ids=["everywhere", "idle"])
def test_ending_the_sign_in_closes_its_socket(
    live_stack: LiveStack, live_db: None, how: Any
) -> None:
    connected, got, reconnected = scenario("queue", how)
    assert connected
    assert got == {"type": "websocket.close", "code": CLOSED_FOR_ACCESS}
    assert not reconnected


def test_deactivation_closes_the_socket_and_voids_votes_links_and_agents(
    live_stack: LiveStack, live_db: None
) -> None:
    """All at once, as an admin's `deactivate_user` does it: the open queue socket
    closes; the vote, the link and the agent's token are void."""
    from django.core.management import call_command

    from approvals import links
    from dispatcher import agents
    from tests.approvals.test_quorum import WRITE, quorum_agent, vote
    from tests.support.factories import make_agent

    seen: dict[str, Any] = {}

    def deactivate(client: Client, user: User) -> Any:
        approval = ask_quorum(WRITE)
        assert vote(client, approval).status_code == 200
        seen["approval"], seen["token"] = approval, links.make_token(approval, user, "approve")
        seen["agent"] = make_agent(owner=user)
        return call_command("deactivate_user", user.username, stdout=io.StringIO())

    def ask_quorum(arguments: dict[str, Any]) -> Any:
        from tests.approvals.conftest import ask

        return ask(quorum_agent(approvals=2), arguments)

    connected, got, reconnected = scenario("queue", deactivate)
    assert connected and not reconnected
    assert got == {"type": "websocket.close", "code": CLOSED_FOR_ACCESS}
    assert seen["approval"].approvers() == []
    with pytest.raises(links.LinkRefused):
        links.read(seen["token"])
    assert agents.authenticate_token(seen["agent"].token) is None
