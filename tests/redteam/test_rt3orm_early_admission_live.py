"""test_rt3orm_early_admission.py's hang-up attack on a real daphne (the live stack): a
client that sends an early-admitted call and hangs up at once leaves no wait slot taken.

Its own module, unmarked: a live test in a module marked django_db(transaction=True) goes
out among the transactional tests (pytest-django's order), and the live stack's worker,
once started, runs calls that the tests after it on that xdist worker mean to stay queued
(tests/conftest.py refuses such a test at collection)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

from dispatcher import limits
from dispatcher.models import Status, ToolCall
from tests.mcp.test_fast_path import call
from tests.redteam.test_mcp_fast_path_attacks_live import _raw_post
from tests.support.factories import AgentFixture
from tests.support.live import LiveStack


def _until(predicate: Callable[[], bool], seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


@pytest.mark.live
def test_live_hang_up_right_after_sending_an_early_call_leaves_no_slot(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    """A client that sends a small call a reviewer must decide (early-admitted) and hangs
    up at once, eight times over, and another eight times with a bad token: the calls
    wait for their reviewer, no wait slot stays taken, daphne logs no traceback, and the
    agent's next call is still answered."""
    fx = live_agent
    session = live_stack.mcp_session(fx, "rt3orm")
    head = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("Mcp-Session-Id", session),
        ("MCP-Protocol-Version", "2025-06-18"),
    ]
    write = {"path": "notes.txt", "content": "hello\n"}
    for i in range(8):
        payload = json.dumps(call(200 + i, "write_file", write)).encode()
        _raw_post(live_stack.url, [("Authorization", f"Bearer {fx.token}"), *head], payload).close()
        _raw_post(live_stack.url, [("Authorization", "Bearer hx_bad"), *head], payload).close()
    calls = ToolCall.objects.filter(session__external_id=session)
    assert _until(lambda: calls.count() == 8 and limits.waits_held(fx.agent) == 0)
    assert {c.status for c in calls} == {Status.PENDING_APPROVAL}
    sock = _raw_post(
        live_stack.url,
        [("Authorization", f"Bearer {fx.token}"), *head],
        json.dumps(call(300, "list_directory", {"path": "."})).encode(),
    )
    with sock:
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    log = (live_stack.log_dir / "daphne.log").read_text(errors="replace")
    assert "Traceback" not in log
