"""The live queue socket against the real Redis channel layer and committed data."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.test import Client

from approvals import live
from approvals.models import ApprovalRequest
from tests.approvals.conftest import closing_connections, open_socket, run_async, session_cookie
from tests.support.factories import AgentFixture, make_user, unique
from tests.support.live import LiveStack
from tests.support.oauth import member

pytestmark = pytest.mark.live

ORIGIN = (b"origin", b"http://127.0.0.1")


def signed_in(*groups: str) -> Client:
    client = Client()
    client.force_login(make_user(unique("user"), groups=groups))
    return client


def submit(
    stack: LiveStack, fx: AgentFixture, session_id: str, call_id: str, path: str
) -> ApprovalRequest:
    arguments = {"path": path, "content": "hello"}
    body = {"calls": [{"id": call_id, "name": "write_file", "arguments": arguments}]}
    with stack.client(fx) as client:
        response = client.post(f"/api/v1/sessions/{session_id}/calls", json=body)
    assert response.status_code == 202, response.text
    return ApprovalRequest.objects.get(call_id=response.json()["calls"][0]["id"])


def new_session(stack: LiveStack, fx: AgentFixture) -> str:
    with stack.client(fx) as client:
        return str(client.post("/api/v1/sessions", json={}).json()["id"])


async def receive_until(communicator: object, pattern: str, seconds: float = 3) -> str:
    """Messages until one matches `pattern`; fails after `seconds`."""
    async with asyncio.timeout(seconds):
        while True:
            message = await communicator.receive_from(timeout=seconds)  # type: ignore[attr-defined]
            if re.search(pattern, message):
                return str(message)


def test_reviewer_socket_gets_the_queue_then_new_asks_and_removals(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    session_id = new_session(live_stack, live_agent)
    waiting = submit(live_stack, live_agent, session_id, "c1", "before.txt")
    reviewer = signed_in("reviewer")
    cookie = (b"cookie", session_cookie(reviewer))
    added: list[ApprovalRequest] = []

    async def scenario() -> tuple[str, str, str]:
        communicator, connected = await open_socket(ORIGIN, cookie)
        assert connected
        catch_up = await receive_until(communicator, r'<section id="approval-items"')
        loop = asyncio.get_running_loop()
        added.append(
            await loop.run_in_executor(
                None,
                closing_connections(
                    lambda: submit(live_stack, live_agent, session_id, "c2", "after.txt")
                ),
            )
        )
        call_id = str(added[0].call_id)
        inserted = await receive_until(communicator, r'hx-swap-oob="beforeend:#approval-items"')
        assert call_id in inserted
        await loop.run_in_executor(
            None,
            closing_connections(
                lambda: reviewer.post(
                    f"/approvals/{added[0].pk}/decide",
                    {"action": "deny", "digest": added[0].call.digest},
                )
            ),
        )
        removed = await receive_until(
            communicator, rf'<div id="call-{call_id}" hx-swap-oob="delete"></div>\s*$'
        )
        await communicator.disconnect()
        return catch_up, inserted, removed

    catch_up, inserted, removed = run_async(scenario)
    assert f'id="call-{waiting.call_id}"' in catch_up  # reconnect catch-up shows what waits
    assert "after.txt" in inserted and "csrfmiddlewaretoken" not in inserted
    assert "beforeend" not in removed


def test_signed_in_non_reviewer_socket_is_refused(live_stack: LiveStack, live_db: None) -> None:
    cookie = (b"cookie", session_cookie(signed_in("auditor")))

    async def attempt() -> bool:
        communicator, connected = await open_socket(ORIGIN, cookie)
        await communicator.disconnect()
        return connected

    assert run_async(attempt) is False


def test_socket_ignores_what_the_browser_sends(live_stack: LiveStack, live_db: None) -> None:
    # A reviewer of a new, empty team: their socket joins that team's queue group only, so
    # a push about another test's call (the organization's group gets every one) cannot
    # arrive in the quiet window below and pass for an answer to what the browser sent.
    reviewer = Client()
    reviewer.force_login(member())
    cookie = (b"cookie", session_cookie(reviewer))

    async def scenario() -> bool:
        communicator, connected = await open_socket(ORIGIN, cookie)
        assert connected
        await communicator.receive_from(timeout=3)  # the catch-up
        await communicator.send_to(text_data='{"action": "approve", "id": 1}')
        nothing = await communicator.receive_nothing(timeout=0.3)
        await communicator.disconnect()
        return nothing

    assert run_async(scenario) is True


def test_a_push_reaches_the_socket_while_the_process_sync_thread_is_busy(
    live_stack: LiveStack, live_db: None
) -> None:
    """A forwarded fragment touches no database: it does not wait for the process's
    shared sync thread (channels closes old connections there before every handler), which
    a slow database call of any other socket may hold."""
    cookie = (b"cookie", session_cookie(signed_in("reviewer")))

    async def scenario() -> float:
        communicator, connected = await open_socket(ORIGIN, cookie)
        assert connected
        await communicator.receive_from(timeout=3)  # the catch-up
        busy = asyncio.create_task(sync_to_async(time.sleep)(1.5))  # holds the sync thread
        await asyncio.sleep(0.1)
        began = time.monotonic()
        marker = f"<p id='busy-{unique('m')}'></p>"
        await get_channel_layer().group_send(live.GROUP, {"type": "queue.push", "html": marker})
        got = await receive_until(communicator, re.escape(marker), seconds=3)
        took = time.monotonic() - began
        assert marker in got
        await busy
        await communicator.disconnect()
        return took

    assert run_async(scenario) < 0.5
