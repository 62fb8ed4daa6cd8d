"""rtfresh: an agent names the addresses in the reviewers' live queue.

daphne takes a request's root path (Django's script name) from any client's
`Daphne-Root-Path` header, and Django makes every URL it reverses during that request
under it. The live queue's push of a new ask is rendered once, after commit, in the
thread of the request that made the ask: the agent's. An agent that sent
`Daphne-Root-Path: https://evil.example` had every open queue show its ask with the
call's page, the decision forms and the step-up challenge at https://evil.example/...
(its "Show the call" link, and the page the queue's desktop notification opens)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client

from tests.approvals.conftest import closing_connections, open_socket, run_async, session_cookie
from tests.support.factories import make_agent, make_user, unique
from tests.support.live import LiveStack

pytestmark = pytest.mark.live

ORIGIN = (b"origin", b"http://127.0.0.1")
EVIL = "https://evil.example"


async def heard(socket: WebsocketCommunicator, seconds: float = 2.0) -> list[str]:
    got = []
    while not await socket.receive_nothing(timeout=seconds):
        got.append(await socket.receive_from(timeout=1))
    return got


def test_an_agents_root_path_names_no_address_in_the_live_queue(
    live_stack: LiveStack, live_db: None
) -> None:
    import httpx

    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    client = Client()
    client.force_login(reviewer)
    cookie = (b"cookie", session_cookie(client))
    agent = make_agent(mode="standard")
    secret = f"rooted-{uuid.uuid4().hex[:8]}.txt"

    def ask_through_daphne() -> None:
        headers = {**agent.headers, "Daphne-Root-Path": EVIL}
        with httpx.Client(base_url=live_stack.url, timeout=30) as web:
            started = web.post("/api/v1/sessions", json={"title": "t"}, headers=headers)
            assert started.status_code == 201, started.text
            body = {
                "calls": [
                    {
                        "id": "w1",
                        "name": "write_file",
                        "arguments": {"path": secret, "content": "x"},
                    }
                ]
            }
            asked = web.post(
                f"/api/v1/sessions/{started.json()['id']}/calls",
                content=json.dumps(body),
                headers={**headers, "Content-Type": "application/json"},
            )
            assert asked.status_code in (200, 201, 202), asked.text

    async def run() -> list[str]:
        socket, connected = await open_socket(ORIGIN, cookie)
        assert connected
        await socket.receive_from(timeout=5)  # the queue on connect
        await asyncio.get_running_loop().run_in_executor(
            None, closing_connections(ask_through_daphne)
        )
        got = await heard(socket)
        await socket.disconnect()
        return got

    pushes = [html for html in run_async(run) if secret in html]
    assert pushes, "the ask was not pushed"
    assert not any("evil.example" in html for html in pushes), pushes[0][:3000]
