"""The dashboard sockets accept a handshake only from their own origin (scheme, host and
port, as Django's CSRF check) or one in CSRF_TRUSTED_ORIGINS: a page served on another
port or over the other scheme of the same host reads nothing."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.test import Client
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.approvals.conftest import open_socket, run_async, session_cookie
from tests.audit.test_live_timeline import open_timeline
from tests.support.factories import make_user, unique
from tests.support.live import LiveStack

pytestmark = pytest.mark.live

PATHS = {"queue": "/ws/approvals/", "timeline": f"/ws/audit/sessions/{uuid.uuid4()}/"}


def cookie_of_a_reviewer_and_auditor() -> str:
    client = Client()
    client.force_login(make_user(unique("both"), groups=("reviewer", "auditor")))
    return session_cookie(client).decode()


def daphne_handshake(url: str, path: str, cookie: str, origin: str) -> int:
    """The HTTP status of a real handshake to daphne: 101 when the socket opened."""
    ws_url = url.replace("http://", "ws://") + path
    try:
        with connect(
            ws_url, additional_headers={"Cookie": cookie, "Origin": origin}, open_timeout=10
        ) as socket:
            socket.recv(timeout=10)  # the catch-up every accepted socket sends first
            return 101
    except InvalidStatus as refused:
        return refused.response.status_code


@pytest.mark.parametrize("socket", PATHS)
def test_daphne_refuses_another_port_or_scheme_of_the_same_host(
    live_stack: LiveStack, live_db: None, socket: str
) -> None:
    cookie = cookie_of_a_reviewer_and_auditor()
    url = live_stack.url  # http://127.0.0.1:<port>
    port = int(url.rsplit(":", 1)[1])
    outcomes = {
        origin: daphne_handshake(url, PATHS[socket], cookie, origin)
        for origin in (
            url,
            f"http://127.0.0.1:{port + 1}",  # a page on another port of the same host
            f"https://127.0.0.1:{port}",  # the other scheme
            "http://127.0.0.1",  # the default port is another port
            f"http://localhost:{port}",  # an allowed host, but not this socket's
            "null",  # a sandboxed frame or a file: page
        )
    }
    assert outcomes == {
        url: 101,
        f"http://127.0.0.1:{port + 1}": 403,
        f"https://127.0.0.1:{port}": 403,
        "http://127.0.0.1": 403,
        f"http://localhost:{port}": 403,
        "null": 403,
    }


def communicator_connects(socket: str, *headers: tuple[bytes, bytes]) -> bool:
    async def attempt() -> bool:
        if socket == "queue":
            communicator, connected = await open_socket(*headers)
        else:
            communicator, connected = await open_timeline(str(uuid.uuid4()), *headers)
        await communicator.disconnect()
        return connected

    return run_async(attempt)


@pytest.mark.parametrize("socket", PATHS)
def test_trusted_origins_are_read_as_csrf_reads_them(
    live_stack: LiveStack, live_db: None, settings: Any, socket: str
) -> None:
    settings.CSRF_TRUSTED_ORIGINS = ["https://*.example.com", "http://tools.internal:8080"]
    cookie = (b"cookie", cookie_of_a_reviewer_and_auditor().encode())
    proxied = (b"host", b"127.0.0.1:8000")  # behind a proxy: the Host is not the page's
    outcomes = {
        origin: communicator_connects(socket, proxied, cookie, (b"origin", origin.encode()))
        for origin in (
            "https://harness.example.com",
            "http://harness.example.com",
            "https://harness.example.com:8443",
            "http://tools.internal:8080",
            "http://tools.internal:8081",
            "https://tools.internal:8080",
            "http://127.0.0.1:8000",
            "http://127.0.0.1:8001",
        )
    }
    assert outcomes == {
        "https://harness.example.com": True,
        "http://harness.example.com": False,
        "https://harness.example.com:8443": False,
        "http://tools.internal:8080": True,
        "http://tools.internal:8081": False,
        "https://tools.internal:8080": False,
        "http://127.0.0.1:8000": True,
        "http://127.0.0.1:8001": False,
    }


def test_a_host_outside_allowed_hosts_is_refused_even_from_its_own_origin(
    live_stack: LiveStack, live_db: None
) -> None:
    cookie = (b"cookie", cookie_of_a_reviewer_and_auditor().encode())
    own = (b"origin", b"http://evil.example")
    assert not communicator_connects("queue", (b"host", b"evil.example"), cookie, own)
    assert communicator_connects(
        "queue", (b"host", b"127.0.0.1"), cookie, (b"origin", b"http://127.0.0.1")
    )
