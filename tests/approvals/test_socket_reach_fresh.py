"""sock: a reviewer's live sockets are opened with the reach of their role then (the queue
socket joins the groups of those teams), and a role or team change closes them with a
message over the channel layer. When that message was lost (Redis down at that moment, a
channel-layer expiry, the sender's process gone, a membership written by hand), the
socket went on pushing the asks of teams the person no longer reviewed: each push
checked only that the account was active with the same password. Each push now reads
the person's reach with that check (one statement, as before) and closes the socket
(4403: the page opens it again, checked anew) when it changed. Likewise a sign-in that
ended (idle or too old) was closed only when the beat's `end_stale_sign_ins` ran: a push
after its end now closes the socket, and such a sign-in opens none.

Against a live daphne with a real WebSocket; the close messages this process sends are
lost on purpose (its channel layer refuses them)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.models import User
from django.test import Client
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from audit.consumers import CLOSED_FOR_ACCESS
from audit.roles import CLOSE_SOCKETS, remove_role
from dispatcher import agents
from identity import services as identity
from teams.models import Membership, Team
from teams.services import add_member, create_team, remove_member
from tests.approvals.conftest import session_cookie
from tests.support.factories import make_user, submit_one, unique
from tests.support.live import LiveStack

# (a cold daphne on a loaded machine took over 120 s to listen)
pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]


@pytest.fixture
def closes_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every close message this process sends is lost (audit.roles.close_sockets logs it
    and goes on, as when Redis is down at that moment); pushes go through."""
    layer = get_channel_layer()
    send = layer.group_send

    async def group_send(group: str, message: dict[str, Any]) -> None:
        if message.get("type") == CLOSE_SOCKETS:
            raise ConnectionError("the close message is lost")
        await send(group, message)

    monkeypatch.setattr(layer, "group_send", group_send)


@contextmanager
def queue_socket(stack: LiveStack, client: Client) -> Iterator[ClientConnection]:
    """The reviewer's queue socket on daphne, past its catch-up."""
    with connect(
        stack.url.replace("http://", "ws://") + "/ws/approvals/",
        additional_headers={"Cookie": session_cookie(client).decode(), "Origin": stack.url},
        open_timeout=30,
    ) as socket:
        socket.recv(timeout=30)  # the whole queue, sent on connect
        yield socket


def until_closed_or(socket: ClientConnection, secret: str) -> tuple[list[str], int | None]:
    """What the socket got until it closed (with its code) or pushed `secret`."""
    got: list[str] = []
    try:
        while True:
            text = str(socket.recv(timeout=30))
            got.append(text)
            if secret in text:
                return got, None
    except ConnectionClosed as closed:
        return got, closed.rcvd.code if closed.rcvd else None


def ask_of(team: Team) -> Callable[[], str]:
    """A function that makes an ask of an agent of `team`: the path only it names."""
    owner = make_user(unique("owner"), mode="standard")
    agent, _ = agents.create_agent(owner=owner, name=unique("agent"), actor="test", team=team)
    session = agents.start_session(agent=agent)

    def ask() -> str:
        secret = unique("after-the-change") + ".txt"
        submit_one(session, "write_file", {"path": secret, "content": "x"}, unique("w"))
        return secret

    return ask


def role_removed(person: User, home: Team, other: Team) -> None:
    remove_role(user=person, role="reviewer", actor="test")


def team_left_by_hand(person: User, home: Team, other: Team) -> None:
    Membership.objects.filter(user=person, team=home).delete()  # (no service: no message)


def moved(person: User, home: Team, other: Team) -> None:
    add_member(team=other, user=person, role="reviewer", actor="test")
    remove_member(team=home, user=person, role="reviewer", actor="test")


def downgraded(person: User, home: Team, other: Team) -> None:
    remove_role(user=person, role="reviewer", actor="test")  # (still a reviewer of `other`)


# Each change: whether the person reviews for the organization, the teams they review,
# and the change whose close message is lost.
CHANGES: dict[str, tuple[bool, tuple[str, ...], Callable[[User, Team, Team], None]]] = {
    "organization role removed": (True, (), role_removed),
    "team membership deleted by hand": (False, ("home",), team_left_by_hand),
    "moved to another team": (False, ("home",), moved),
    "organization role downgraded to a team's": (True, ("other",), downgraded),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_reach_changed_with_its_close_lost_carries_no_ask_of_the_old_team(
    live_stack: LiveStack, live_db: None, closes_lost: None, change: str
) -> None:
    org, team_roles, make_change = CHANGES[change]
    teams = {name: create_team(name=unique(name), actor="test") for name in ("home", "other")}
    ask = ask_of(teams["home"])
    person = make_user(unique("reviewer"), groups=("reviewer",) if org else ())
    for name in team_roles:
        add_member(team=teams[name], user=person, role="reviewer", actor="test")
    browser = Client()
    browser.force_login(person)
    with queue_socket(live_stack, browser) as socket:
        make_change(person, teams["home"], teams["other"])
        secret = ask()
        got, code = until_closed_or(socket, secret)
    # Before: the ask was pushed to the socket, which stayed open.
    assert not any(secret in text for text in got), "the old team's ask reached the socket"
    assert code == CLOSED_FOR_ACCESS


def test_a_socket_whose_reach_did_not_change_keeps_its_pushes(
    live_stack: LiveStack, live_db: None
) -> None:
    """The check closes nothing that still holds: a team reviewer gets their team's ask."""
    home = create_team(name=unique("home"), actor="test")
    ask = ask_of(home)
    person = make_user(unique("reviewer"))
    add_member(team=home, user=person, role="reviewer", actor="test")
    browser = Client()
    browser.force_login(person)
    with queue_socket(live_stack, browser) as socket:
        secret = ask()
        got, code = until_closed_or(socket, secret)
    assert code is None and secret in got[-1]


@pytest.fixture
def ending_sign_in(live_db: None) -> Iterator[tuple[Client, float]]:
    """A reviewer's sign-in that ends (HARNESS_SESSION_MAX_AGE, as the live daphne has it)
    a few seconds from now: the browser, and when."""
    person = make_user(unique("reviewer"), groups=("reviewer",))
    browser = Client()
    browser.force_login(person)
    now = time.time()
    ends = now + 8
    session = browser.session
    session[identity.SIGNED_IN_AT] = ends - settings.HARNESS_SESSION_MAX_AGE
    session[identity.SEEN_AT] = now
    session.save()
    yield browser, ends


def test_a_sign_in_that_ended_is_closed_at_the_next_push(
    live_stack: LiveStack, ending_sign_in: tuple[Client, float]
) -> None:
    browser, ends = ending_sign_in
    ask = ask_of(Team.objects.default())
    with queue_socket(live_stack, browser) as socket:
        time.sleep(max(0.0, ends - time.time()) + 0.5)  # (the sign-in's end is a time)
        secret = ask()
        got, code = until_closed_or(socket, secret)
    # Before: pushed, until the beat's end_stale_sign_ins ended the sign-in.
    assert not any(secret in text for text in got), "an ended sign-in's socket got the ask"
    assert code == CLOSED_FOR_ACCESS
    # And the page cannot open it again with that sign-in.
    with pytest.raises(InvalidStatus) as refused, queue_socket(live_stack, browser):
        pass
    assert refused.value.response.status_code == 403
