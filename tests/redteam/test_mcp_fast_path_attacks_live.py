"""test_mcp_fast_path_attacks.py's hang-up attack on a real daphne (the live stack): a
client hanging up on a held fast call gives its wait slot back and leaves the call for
its reviewer.

Its own module, unmarked: a live test in a module marked django_db(transaction=True) goes
out among the transactional tests (pytest-django's order), and the live stack's worker,
once started, runs calls that the tests after it on that xdist worker mean to stay queued
(tests/conftest.py refuses such a test at collection)."""

from __future__ import annotations

import json
import socket
import time

import pytest

from dispatcher import limits
from dispatcher.models import Status
from tests.mcp.conftest import wait_for_pending
from tests.redteam.test_mcp_fast_path_attacks import PROMPT, body
from tests.support.factories import AgentFixture
from tests.support.live import LiveStack

# `slow` (make test-all), as the rest of test_mcp_fast_path_attacks.py.
pytestmark = pytest.mark.slow


def _raw_post(url: str, head: list[tuple[str, str]], payload: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    lines = ["POST /mcp/ HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(payload)}"]
    lines += [f"{k}: {v}" for k, v in head]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
    return sock


def _live_session(live_stack: LiveStack, fx: AgentFixture) -> str:
    return live_stack.mcp_session(fx, "rt37")


@pytest.mark.live
def test_live_hang_up_during_a_held_fast_call_gives_the_slot_back(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    fx = live_agent
    session = _live_session(live_stack, fx)
    head = [
        ("Authorization", f"Bearer {fx.token}"),
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("Mcp-Session-Id", session),
        ("MCP-Protocol-Version", "2025-06-18"),
    ]
    sock = _raw_post(
        live_stack.url,
        head,
        json.dumps(body(11, name="approval_prompt", arguments=PROMPT)).encode(),
    )
    # (a held call's stream sends its headers with its first ping, 15 s on: the client
    # leaves before, once the call waits for its reviewer)
    held = wait_for_pending(session, tool="client_tool")
    assert limits.waits_held(fx.agent) == 1
    sock.close()
    deadline = time.monotonic() + 20
    while limits.waits_held(fx.agent) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert limits.waits_held(fx.agent) == 0
    held.refresh_from_db()
    assert held.status == Status.PENDING_APPROVAL
    log = (live_stack.log_dir / "daphne.log").read_text(errors="replace")
    assert "Traceback" not in log
