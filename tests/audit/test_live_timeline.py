"""An auditor's open timeline is pushed every change of its session (no polling)."""

from __future__ import annotations

import uuid

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from dispatcher.wakeups import publish_change
from tests.approvals.conftest import run_async, session_cookie, with_host
from tests.audit.test_timeline_pages import bulk_session
from tests.support.factories import make_user, unique
from tests.support.live import LiveStack

pytestmark = pytest.mark.live

ORIGIN = (b"origin", b"http://127.0.0.1")


def cookie_for(*groups: str) -> tuple[bytes, bytes]:
    client = Client()
    client.force_login(make_user(unique("user"), groups=groups))
    return (b"cookie", session_cookie(client))


async def open_timeline(
    session_id: str, *headers: tuple[bytes, bytes]
) -> tuple[WebsocketCommunicator, bool]:
    from harness_site.asgi import application

    communicator = WebsocketCommunicator(
        application, f"/ws/audit/sessions/{session_id}/", headers=with_host(headers)
    )
    connected, _ = await communicator.connect(timeout=5)
    return communicator, connected


def test_auditor_timeline_hears_each_change_of_its_session(
    live_stack: LiveStack, live_db: None
) -> None:
    cookie = cookie_for("auditor")
    session_id, _ = bulk_session(2)
    other = str(uuid.uuid4())

    async def scenario() -> list[str]:
        communicator, connected = await open_timeline(session_id, ORIGIN, cookie)
        assert connected
        heard = [await communicator.receive_from(timeout=5)]  # the catch-up on connect
        await sync_to_async(publish_change)(str(uuid.uuid4()), other, "queued")
        await sync_to_async(publish_change)(str(uuid.uuid4()), session_id, "queued")
        heard.append(await communicator.receive_from(timeout=5))
        assert await communicator.receive_nothing(timeout=0.3)  # the other session's change
        await communicator.send_to(text_data="ignored")  # push-only
        await communicator.disconnect()
        return heard

    heard = run_async(scenario)
    # Each message is the session's summary, a fragment htmx swaps in by its id.
    assert len(heard) == 2
    assert all(m.startswith('<p id="audit-summary"') for m in heard), heard
    assert all("2 calls in this session" in m for m in heard), heard


@pytest.mark.parametrize("groups", [(), ("reviewer",)])
def test_non_auditors_cannot_open_a_timeline_socket(
    live_stack: LiveStack, live_db: None, groups: tuple[str, ...]
) -> None:
    cookie = cookie_for(*groups)

    async def scenario() -> bool:
        communicator, connected = await open_timeline(str(uuid.uuid4()), ORIGIN, cookie)
        await communicator.disconnect()
        return connected

    assert run_async(scenario) is False


def test_foreign_origin_and_anonymous_are_refused(live_stack: LiveStack, live_db: None) -> None:
    cookie = cookie_for("auditor")

    async def scenario() -> tuple[bool, bool]:
        foreign, a = await open_timeline(
            str(uuid.uuid4()), (b"origin", b"http://evil.example"), cookie
        )
        anonymous, b = await open_timeline(str(uuid.uuid4()), ORIGIN)
        await foreign.disconnect()
        await anonymous.disconnect()
        return a, b

    assert run_async(scenario) == (False, False)
