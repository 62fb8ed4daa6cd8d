"""A sign-in that ends takes its open sockets with it: signing out everywhere and an idle
sign-in ended by the beat close the approval queue's socket at once."""

from __future__ import annotations

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
