"""test_inline_loop_attacks.py's attack on a real daphne (the live stack), where the inline
call's upstream request is made on the loop that serves every request.

Its own module, unmarked: a live test in a module marked django_db(transaction=True) goes
out among the transactional tests (pytest-django's order), and the live stack's worker,
once started, runs calls that the tests after it on that xdist worker mean to stay queued
(tests/conftest.py refuses such a test at collection)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.mcp.test_fast_path import call
from tests.redteam import test_inline_loop_attacks as loop_attacks
from tests.redteam.test_inline_loop_attacks import DB_MARGIN, TIMEOUT, Hostile, register
from tests.support.factories import AgentFixture, make_agent
from tests.support.live import LiveStack
from tests.support.mcp_requests import HANDSHAKE, initialize

hostile = loop_attacks.hostile  # (a hostile upstream server process, loopback)


def live_call(stack: LiveStack, fx: AgentFixture, session: str, body: Any) -> tuple[float, Any]:
    """A tools/call on the live daphne: how long it took, and its JSON-RPC result."""
    started = time.monotonic()
    response = httpx.post(
        stack.url + "/mcp/",
        json=body,
        headers={
            **fx.headers,
            "Accept": "application/json, text/event-stream",
            "Mcp-Session-Id": session,
            "MCP-Protocol-Version": HANDSHAKE,
        },
        timeout=60,
    )
    took = time.monotonic() - started
    assert response.status_code == 200, response.text[:500]
    if response.headers["content-type"] == "application/json":  # (answered within a second)
        return took, response.json()["result"]
    [data] = [
        line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")
    ]
    return took, json.loads(data)["result"]


@pytest.mark.live
def test_live_a_hostile_upstream_does_not_hold_up_daphnes_other_requests(
    hostile: Hostile, live_stack: LiveStack, live_db: None
) -> None:
    """On a real daphne, where the inline call's upstream request is made on the loop that
    serves every request: one agent's call of a server that never answers, another's of
    a 30 MB answer; meanwhile a third agent's requests are answered without a stall of a
    second (half the tool's timeout), the first call ends at its host-only timeout and the
    second is answered."""
    name = register(hostile.url)
    # (another registration of it: a session of its own, not waiting behind `never`'s; a
    # timeout of its own, as a loaded host took longer than 2 s to read the 30 MB)
    big_timeout = 30.0
    big_name = register(hostile.url, timeout=big_timeout)
    fx, big, other = (make_agent(mode="trusted") for _ in range(3))
    sessions = {}
    for agent in (fx, big):
        answer = httpx.post(
            live_stack.url + "/mcp/",
            json=initialize("rtloop", run=uuid.uuid4().hex),
            headers={**agent.headers, "Accept": "application/json, text/event-stream"},
            timeout=60,
        )
        sessions[agent.token] = answer.headers["mcp-session-id"]
    results: dict[str, tuple[float, Any]] = {}

    def run(key: str, agent: AgentFixture, body: Any) -> None:
        results[key] = live_call(live_stack, agent, sessions[agent.token], body)

    threads = [
        threading.Thread(target=run, args=("never", fx, call(1, f"{name}__never", {}))),
        threading.Thread(
            target=run, args=("huge", big, call(1, f"{big_name}__huge", {"megabytes": 30}))
        ),
    ]
    with httpx.Client(base_url=live_stack.url, headers=other.headers, timeout=60) as client:

        def slowest_while(busy: Any) -> float:
            slowest = 0.0
            while busy():
                started = time.monotonic()
                assert client.get("/api/v1/tools").status_code == 200
                slowest = max(slowest, time.monotonic() - started)
                # (10 a second at most: the agent's rate, 20 a second after a burst of 60,
                # answered 429 to a loop that ran 2 s before the calls and 2-3 s with them)
                time.sleep(0.1)
            return slowest

        # The same requests' slowest before the calls, 2 s: what the host's load alone
        # costs them (a loaded host took 1.2 s with no stall of the loop at all).
        quiet_until = time.monotonic() + 2
        quiet = slowest_while(lambda: time.monotonic() < quiet_until)
        for thread in threads:
            thread.start()
        slowest = slowest_while(lambda: any(thread.is_alive() for thread in threads))
    for thread in threads:
        thread.join(60)
    never_took, never = results["never"]
    huge_took, huge = results["huge"]
    print(
        f"live: slowest other request {slowest:.3f}s (before: {quiet:.3f}s), huge {huge_took:.2f}s"
    )
    assert never["isError"] is True and never_took < TIMEOUT + 1 + DB_MARGIN, never_took
    assert huge["isError"] is False and huge["content"][0]["text"].startswith("x" * 1000), str(
        huge
    )[:600]
    assert huge_took < big_timeout, huge_took
    assert slowest < TIMEOUT / 2 + 2 * quiet, (slowest, quiet)
    log = (live_stack.log_dir / "daphne.log").read_text(errors="replace")
    assert "Traceback" not in log
