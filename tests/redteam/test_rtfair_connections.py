"""rtfair: one network peer holding every connection daphne can open. Each open
connection holds a file descriptor until its receive clock rings (30 s); a peer that
opened as many as the process may hold, dripping a byte into each, had another agent's
request closed unanswered. A real daphne with a small open-files limit (prlimit), the
peer on 127.0.0.2 and the agent on 127.0.0.1 (harness_site.slow_clients)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.factories import AgentFixture, make_agent
from tests.support.live import daphne, free_port, live_env

pytestmark = pytest.mark.live

FILES = 400  # the daphne's open-files limit
PEER_CONNECTIONS = 450  # past it
PER_ADDRESS = 50  # HARNESS_MAX_CONNECTIONS_PER_ADDRESS of the test daphne


@pytest.fixture
def small_daphne(django_db_setup: None, django_db_blocker: object, tmp_path: Path) -> Iterator[str]:
    env = {
        **live_env(tmp_path),
        "HARNESS_DB_POOL_MAX": "4",
        "HARNESS_MAX_CONNECTIONS_PER_ADDRESS": str(PER_ADDRESS),
    }
    port = free_port()
    with daphne(env, port, tmp_path / "daphne.log") as url:
        listening = subprocess.run(
            ["lsof", "-t", f"-iTCP:{port}", "-sTCP:LISTEN"], capture_output=True, text=True
        ).stdout.split()
        subprocess.run(["prlimit", "--pid", listening[0], f"--nofile={FILES}:{FILES}"], check=True)
        yield url


@pytest.fixture
def agent(small_daphne: str, django_db_blocker: object) -> AgentFixture:
    with django_db_blocker.unblock():  # type: ignore[attr-defined]
        return make_agent(mode="standard")


def test_one_peers_open_connections_leave_another_agent_served(
    small_daphne: str, agent: AgentFixture
) -> None:
    port = int(small_daphne.rsplit(":", 1)[1])
    held = []
    try:
        for _ in range(PEER_CONNECTIONS):
            peer = socket.socket()
            held.append(peer)
            peer.bind(("127.0.0.2", 0))
            start_a_request(peer, port)
        with httpx.Client(base_url=small_daphne, headers=agent.headers, timeout=10) as client:
            response = client.get("/api/v1/tools")
        assert response.status_code == 200, response.text[:300]
    finally:
        for peer in held:
            peer.close()


def start_a_request(peer: socket.socket, port: int) -> None:
    """The start of a request, never finished (the slow client's part). A connection the
    per-address bound closed at once may be reset by the time it sends."""
    with contextlib.suppress(OSError):
        peer.connect(("127.0.0.1", port))
        peer.sendall(b"GET /api/v1/tools HTTP/1.1\r\nHost: x\r\n")
