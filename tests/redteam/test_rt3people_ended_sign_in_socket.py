"""rt3people: a sign-in ended by a person or an admin (sign out everywhere, "end this
sign-in" on the sessions page, the beat) deletes its session and closes its sockets with
a message over the channel layer. When that message was lost (Redis down at that moment,
the sender's process gone; or the session row deleted by hand), the socket went on
pushing asks: each push checked the account, its password, its reach and the sign-in's
end by the clock, never that the sign-in itself still existed. The sign-in's session now
answers in the same read (teams.scope.sign_in_scope), and a socket whose sign-in is gone
closes (4403) at the next push; the page cannot open it again (no sign-in).

Against a live daphne with a real WebSocket; the close messages this process sends are
lost on purpose (its channel layer refuses them)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.test import Client

from audit import kinds
from audit.consumers import CLOSED_FOR_ACCESS
from identity import services as identity
from teams.models import Team
from tests.approvals.test_socket_reach_fresh import (
    ask_of,
    closes_lost,
    queue_socket,
    until_closed_or,
)
from tests.support.factories import make_user, unique
from tests.support.live import LiveStack

pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]
__all__ = ["closes_lost"]  # the fixture (tests/approvals/test_socket_reach_fresh.py)


def signed_out_everywhere(person: User, key: str) -> None:
    identity.sign_out_everywhere(user=person, current=key)


def ended_by_an_admin(person: User, key: str) -> None:
    identity.end_sign_ins(
        user=person, session_keys=[key], actor="admin", kind=kinds.SESSION_EXPIRED, reason="test"
    )


def session_deleted_by_hand(person: User, key: str) -> None:
    Session.objects.filter(session_key=key).delete()  # (no service: no message)


ENDINGS: dict[str, Callable[[User, str], None]] = {
    "signed out everywhere": signed_out_everywhere,
    "ended by an admin": ended_by_an_admin,
    "session row deleted by hand": session_deleted_by_hand,
}


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.usefixtures("closes_lost")
def test_a_sign_in_ended_with_its_close_lost_gets_no_more_asks(
    live_stack: LiveStack, live_db: None, ending: str
) -> None:
    ask = ask_of(Team.objects.default())
    person = make_user(unique("reviewer"), groups=("reviewer",))
    browser = Client()
    browser.force_login(person)
    key = browser.session.session_key
    assert key
    with queue_socket(live_stack, browser) as socket:
        ENDINGS[ending](person, key)
        assert not Session.objects.filter(session_key=key).exists()
        secret = ask()
        got, code = until_closed_or(socket, secret)
    # Before: the ask was pushed to a sign-in that no longer existed, and the socket
    # stayed open until the person's password or role changed.
    assert not any(secret in text for text in got), "an ended sign-in's socket got the ask"
    assert code == CLOSED_FOR_ACCESS


def test_a_sign_in_that_holds_keeps_its_pushes(live_stack: LiveStack, live_db: None) -> None:
    """The session check closes nothing that still holds (another sign-in of the same
    person ended does not close this one)."""
    ask = ask_of(Team.objects.default())
    person = make_user(unique("reviewer"), groups=("reviewer",))
    browser, other = Client(), Client()
    browser.force_login(person)
    other.force_login(person)
    with queue_socket(live_stack, browser) as socket:
        identity.end_sign_ins(
            user=person,
            session_keys=[other.session.session_key or ""],
            actor="admin",
            kind=kinds.SESSION_EXPIRED,
            reason="test",
        )
        secret = ask()
        got, code = until_closed_or(socket, secret)
    assert code is None and secret in got[-1]
