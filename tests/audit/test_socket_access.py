"""A dashboard socket lives only as long as its user's role, sign-in and account: removing
the role, signing out or deactivating the user closes the approval queue and the audit
timeline sockets at once."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from audit import roles
from audit.consumers import CLOSED_FOR_ACCESS
from audit.models import AuditEvent
from tests.approvals.conftest import (
    ask,
    closing_connections,
    open_socket,
    run_async,
    session_cookie,
)
from tests.audit.test_live_timeline import open_timeline
from tests.support.factories import AgentFixture, make_user, unique
from tests.support.live import LiveStack

pytestmark = pytest.mark.live

ORIGIN = (b"origin", b"http://127.0.0.1")
Opener = Callable[[tuple[bytes, bytes]], Awaitable[tuple[WebsocketCommunicator, bool]]]


async def queue(cookie: tuple[bytes, bytes]) -> tuple[WebsocketCommunicator, bool]:
    return await open_socket(ORIGIN, cookie)


async def timeline(cookie: tuple[bytes, bytes]) -> tuple[WebsocketCommunicator, bool]:
    return await open_timeline(str(uuid.uuid4()), ORIGIN, cookie)


SOCKETS = {"queue": ("reviewer", queue), "timeline": ("auditor", timeline)}


def scenario(socket: str, act: Callable[[Client, User], object]) -> tuple[bool, object, bool]:
    """A user's open socket; `act` runs in another thread (committed, as a real request);
    returns: connected, what the socket got next, whether the same cookie connects again."""
    role, opener = SOCKETS[socket]
    user = make_user(unique(role), groups=(role,))
    client = Client()
    client.force_login(user)
    cookie = (b"cookie", session_cookie(client))

    async def run() -> tuple[bool, object, bool]:
        communicator, connected = await opener(cookie)
        await communicator.receive_from(timeout=5)  # the catch-up on connect
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, closing_connections(lambda: act(client, user)))
        # The first close, or "nothing": pushes meant for everyone on the queue (other
        # tests' calls finishing on the shared live stack) may arrive meanwhile.
        got: object = "nothing"
        while not await communicator.receive_nothing(timeout=2):
            output = await communicator.receive_output(timeout=1)
            if output.get("type") == "websocket.close":
                got = output
                break
        await communicator.disconnect()
        again, reconnected = await opener(cookie)
        await again.disconnect()
        return connected, got, reconnected

    return run_async(run)


def remove(role: str) -> Callable[[Client, User], object]:
    return lambda client, user: roles.remove_role(user=user, role=role, actor="test")


@pytest.mark.parametrize("socket", SOCKETS)
def test_removing_the_role_closes_the_open_socket(
    live_stack: LiveStack, live_db: None, socket: str
) -> None:
    connected, got, reconnected = scenario(socket, remove(SOCKETS[socket][0]))
    assert connected
    assert got == {"type": "websocket.close", "code": CLOSED_FOR_ACCESS}
    assert not reconnected


@pytest.mark.parametrize("socket", SOCKETS)
def test_signing_out_closes_the_open_socket(
    live_stack: LiveStack, live_db: None, socket: str
) -> None:
    connected, got, reconnected = scenario(
        socket, lambda client, user: client.post("/accounts/logout/")
    )
    assert connected
    assert got == {"type": "websocket.close", "code": CLOSED_FOR_ACCESS}
    assert not reconnected  # the sign-in is over: its cookie opens nothing


def test_another_users_removal_or_sign_out_leaves_the_socket_open(
    live_stack: LiveStack, live_db: None
) -> None:
    other = make_user(unique("reviewer"), groups=("reviewer",))
    other_client = Client()
    other_client.force_login(other)

    def others_leave(client: Client, user: User) -> None:
        roles.remove_role(user=other, role="reviewer", actor="test")
        other_client.post("/accounts/logout/")

    connected, got, reconnected = scenario("queue", others_leave)
    assert connected
    assert got == "nothing"
    assert reconnected


def test_removing_one_role_closes_the_other_roles_socket_which_reopens(
    live_stack: LiveStack, live_db: None
) -> None:
    """Every socket of the user closes; one that still fits a role it holds opens again."""
    user = make_user(unique("both"), groups=("reviewer", "auditor"))
    client = Client()
    client.force_login(user)
    cookie = (b"cookie", session_cookie(client))

    async def run() -> tuple[object, bool]:
        communicator, connected = await timeline(cookie)
        assert connected
        await communicator.receive_from(timeout=5)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            None, closing_connections(lambda: remove("reviewer")(client, user))
        )
        got = await communicator.receive_output(timeout=3)
        again, reconnected = await timeline(cookie)
        await again.disconnect()
        return got, reconnected

    got, reconnected = run_async(run)
    assert got == {"type": "websocket.close", "code": CLOSED_FOR_ACCESS}
    assert reconnected


def deactivate_by_service(client: Client, user: User) -> object:
    return roles.deactivate(user=user, actor="user:admin")


def deactivate_by_save(client: Client, user: User) -> object:
    user.is_active = False  # as the shell or an identity provider's sync would
    user.save()
    return None


@pytest.mark.parametrize("socket", SOCKETS)
@pytest.mark.parametrize(
    "how", [deactivate_by_service, deactivate_by_save], ids=["service", "save"]
)
def test_deactivating_the_user_closes_the_open_socket(
    live_stack: LiveStack, live_db: None, socket: str, how: Callable[[Client, User], object]
) -> None:
    connected, got, reconnected = scenario(socket, how)
    assert connected
    assert got == {"type": "websocket.close", "code": CLOSED_FOR_ACCESS}
    assert not reconnected


def test_deactivation_is_audited_once(live_stack: LiveStack, live_db: None) -> None:
    user = make_user(unique("reviewer"), groups=("reviewer",))
    assert roles.deactivate(user=user, actor="user:admin")
    assert not roles.deactivate(user=user, actor="user:admin")
    events = AuditEvent.objects.filter(kind="user.deactivated", subject=f"user:{user.username}")
    assert [(event.actor, event.payload) for event in events] == [
        ("user:admin", {"user": user.username, "votes_voided": [], "agents_revoked": []})
    ]
    assert not roles.has_role(User.objects.get(pk=user.pk), "reviewer")


def test_a_deactivation_no_signal_sees_closes_the_socket_at_the_next_push(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    """A bulk update sends no post_save: the socket re-reads is_active before a push, and
    closes instead of sending the new ask to a deactivated user."""

    def deactivate_then_ask(client: Client, user: User) -> object:
        User.objects.filter(pk=user.pk).update(is_active=False)
        return ask(live_agent, {"path": "after.txt", "content": "x"})

    connected, got, reconnected = scenario("queue", deactivate_then_ask)
    assert connected
    assert got == {"type": "websocket.close", "code": CLOSED_FOR_ACCESS}
    assert not reconnected
