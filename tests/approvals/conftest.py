"""Helpers for approvals tests: calls that ask, made through the real agent API."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connections
from django.test import Client

from approvals.models import ApprovalRequest
from tests.support.factories import AgentFixture


def start_session(fx: AgentFixture, title: str = "review me") -> str:
    response = Client().post(
        "/api/v1/sessions",
        data=json.dumps({"title": title}),
        content_type="application/json",
        headers=fx.headers,
    )
    assert response.status_code == 201, response.content
    return str(response.json()["id"])


def ask(
    fx: AgentFixture,
    arguments: dict[str, Any] | None = None,
    *,
    session_id: str | None = None,
    name: str = "write_file",
    call_id: str = "w1",
) -> ApprovalRequest:
    """Submit one call that asks (write_file in standard mode) and return its request."""
    session_id = session_id or start_session(fx)
    body = {"calls": [{"id": call_id, "name": name, "arguments": arguments or {}}]}
    response = Client().post(
        f"/api/v1/sessions/{session_id}/calls",
        data=json.dumps(body),
        content_type="application/json",
        headers=fx.headers,
    )
    assert response.status_code in (200, 202), response.content
    call = response.json()["calls"][0]
    assert call["status"] == "pending_approval", call
    return ApprovalRequest.objects.select_related("call").get(call_id=call["id"])


def run_async[T](function: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine function to completion on a fresh loop in its own thread (the
    session's Playwright may hold a running loop in this thread)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, function()).result(timeout=60)


def session_cookie(client: Client) -> bytes:
    name = settings.SESSION_COOKIE_NAME
    return f"{name}={client.cookies[name].value}".encode()


HOST = (b"host", b"127.0.0.1")


def with_host(headers: tuple[tuple[bytes, bytes], ...]) -> list[tuple[bytes, bytes]]:
    """`headers` with the Host a browser sends (127.0.0.1) unless one is given: the Origin
    check compares the Origin with the socket's own scheme and Host."""
    return [*headers] if any(name == b"host" for name, _ in headers) else [HOST, *headers]


async def open_socket(*headers: tuple[bytes, bytes]) -> tuple[WebsocketCommunicator, bool]:
    from harness_site.asgi import application

    communicator = WebsocketCommunicator(application, "/ws/approvals/", headers=with_host(headers))
    connected, _ = await communicator.connect(timeout=5)
    return communicator, connected


def closing_connections[T](function: Callable[[], T]) -> Callable[[], T]:
    """`function` for another thread: its database connection is closed when it returns,
    so the test database can be dropped at the end of the run."""

    def run() -> T:
        try:
            return function()
        finally:
            connections.close_all()

    return run
