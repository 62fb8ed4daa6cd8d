"""rtq: the per-address connection count (harness_site.slow_clients) must give a
connection back when it closes, whatever it became. A WebSocket upgrade hands the TCP
connection to daphne's WebSocket protocol, whose close the HTTP protocol never heard of:
each WebSocket ever opened stayed counted, and a browser that reconnected its approval
queue (or anyone, with upgrade requests nobody authenticates) had its address refused
every connection until daphne restarted. A real daphne with a small bound."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.live import daphne, free_port, live_env

pytestmark = pytest.mark.live

PER_ADDRESS = 4


@pytest.fixture
def bounded_daphne(django_db_setup: None, tmp_path: Path) -> Iterator[str]:
    env = {**live_env(tmp_path), "HARNESS_MAX_CONNECTIONS_PER_ADDRESS": str(PER_ADDRESS)}
    with daphne(env, free_port(), tmp_path / "daphne.log") as url:
        yield url


def open_and_close_websocket(port: int) -> bytes:
    """One WebSocket handshake (no session: the app closes it), read, then closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"GET /ws/approvals/ HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n"
        )
        answer = b""
        with contextlib.suppress(ConnectionResetError):  # refused: reset as it opened
            while chunk := sock.recv(4096):
                answer += chunk
        return answer


def test_closed_websockets_give_their_connections_back(bounded_daphne: str) -> None:
    port = int(bounded_daphne.rsplit(":", 1)[1])
    answers = [open_and_close_websocket(port) for _ in range(PER_ADDRESS * 2)]
    assert all(answer.startswith(b"HTTP/1.1 ") for answer in answers), answers
    with httpx.Client(base_url=bounded_daphne, timeout=10) as client:
        response = client.get("/api/v1/tools")
    assert response.status_code == 401, response.text[:300]
