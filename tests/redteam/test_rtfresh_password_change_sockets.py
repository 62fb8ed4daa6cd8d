"""rtfresh: a person who changes their password ends their other sign-ins (Django: their
sessions' hash no longer matches, so their next request is signed out), but the sockets
those sign-ins had open stayed open: the live queue went on pushing every new ask, its
arguments included, to a browser whose cookie no longer opened any page (a stolen
session, say, that its owner meant to end by changing the password). A socket now
checks, before every push, that its sign-in still holds (the account active, and the
password it was opened with), as the next page request would, and closes instead."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from audit.consumers import CLOSED_FOR_ACCESS
from tests.approvals.conftest import (
    ask,
    closing_connections,
    open_socket,
    run_async,
    session_cookie,
)
from tests.support.factories import make_agent, make_user, unique

ORIGIN = (b"origin", b"http://127.0.0.1")


@pytest.fixture
def committed(django_db_setup: None, django_db_blocker: object) -> Iterator[None]:
    """Autocommit, as the live tests' `live_db`: the socket's own thread reads it."""
    with django_db_blocker.unblock():  # type: ignore[attr-defined]
        yield


def change_password(user: Any) -> None:
    other = Client()  # another sign-in of the same person: their laptop
    other.force_login(user)
    new = "a-new-password-" + unique("pw")
    form = {"oldpassword": "pw-" + user.username, "password1": new, "password2": new}
    changed = other.post("/accounts/password/change/", form)
    assert changed.status_code == 302, changed.content[:500]


def test_changing_the_password_ends_the_other_sign_ins_sockets(committed: None) -> None:
    user = make_user(unique("reviewer"), groups=("reviewer",))
    stolen = Client()
    stolen.force_login(user)
    cookie = (b"cookie", session_cookie(stolen))
    agent = make_agent(mode="standard")
    secret = unique("after-the-change") + ".txt"

    async def run() -> tuple[bool, list[str]]:
        communicator, connected = await open_socket(ORIGIN, cookie)
        await communicator.receive_from(timeout=5)  # the catch-up on connect
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, closing_connections(lambda: change_password(user)))
        # The stolen cookie opens no page any more...
        page = await loop.run_in_executor(None, closing_connections(lambda: stolen.get("/")))
        assert page.status_code == 302
        # ...and its open socket carries no ask made after it.
        await loop.run_in_executor(
            None, closing_connections(lambda: ask(agent, {"path": secret, "content": "x"}))
        )
        got: list[str] = []
        while not await communicator.receive_nothing(timeout=3):
            output = await communicator.receive_output(timeout=1)
            if output.get("type") == "websocket.close":
                got.append(f"close {output.get('code')}")
                break
            got.append(str(output.get("text", "")))
        await communicator.disconnect()
        return connected, got

    connected, got = run_async(run)
    assert connected
    assert not any(secret in text for text in got), "the ask was pushed to the ended sign-in"
    assert got == [f"close {CLOSED_FOR_ACCESS}"]
