"""Red team (rt7audit) of the export slot a long replay holds while it is
streamed (audit.streaming.Held), through a real daphne: what held.

A client that leaves a streamed page (mid-stream, or before the page was made: the request
sent and the connection closed while the view still renders the first MiB, which Django's
handler then never sends nor closes) gives the person's only slot back
(HARNESS_MAX_EXPORTS_PER_PERSON=1): the same person's next long page is served, never
refused for a slot nobody holds. tests/redteam/test_rt6audit_long_page_slots.py checks the
slot with the test client, which closes nothing; here the server does what it does."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.audit.chains import bulk_chain
from tests.redteam.test_rtaudit_export_pacing import _auditor_cookie, committed  # noqa: F401
from tests.support.live import daphne, free_port, live_env

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600)]

EVENTS = 3000
PAD = "x" * 600  # a replay of about 3 MB: streamed past its first MiB


@pytest.fixture(scope="module")
def port(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    tmp: Path = tmp_path_factory.mktemp("rt7slots")
    env = {
        **live_env(tmp),
        "HARNESS_MAX_EXPORTS": "4",
        "HARNESS_MAX_EXPORTS_PER_PERSON": "1",
        "HARNESS_MAX_EXPORTS_PER_TEAM": "0",
    }
    number = free_port()
    with daphne(env, number, tmp / "daphne.log"):
        yield number


def _send(port: int, path: str, cookie: str) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: {cookie}\r\n"
        "Connection: close\r\n\r\n".encode()
    )
    return sock


def _status(sock: socket.socket) -> bytes:
    head = b""
    while b"\r\n" not in head and (chunk := sock.recv(4096)):
        head += chunk
    return head.split(b"\r\n", 1)[0]


def _served_again(port: int, path: str, cookie: str) -> bytes:
    """The status line of the same person's next request once the slot is back: a 503
    while the left page's view still runs (it takes the slot at its first MiB) is asked
    again, for at most a minute (the page takes about a second to make)."""
    deadline = time.monotonic() + 60
    while True:
        sock = _send(port, path, cookie)
        try:
            status = _status(sock)
        finally:
            sock.close()
        if b" 503 " not in status or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


@pytest.mark.usefixtures("committed")
def test_a_client_that_leaves_a_streamed_replay_gives_its_slot_back(port: int) -> None:
    chain = bulk_chain(EVENTS, pad=PAD)
    cookie = _auditor_cookie()
    url = f"/audit/sessions/{chain}/replay/"
    # Read while the page streams: the person's one slot is held, a second page refused.
    reading = _send(port, url, cookie)
    assert b" 200 " in _status(reading)
    refused = _send(port, url, cookie)
    assert b" 503 " in _status(refused)
    refused.close()
    # Gone mid-stream.
    reading.close()
    assert b" 200 " in _served_again(port, url, cookie)
    # Gone before the page was made: asked and closed at once, a few times over.
    for _ in range(3):
        _send(port, url, cookie).close()
    assert b" 200 " in _served_again(port, url, cookie)
