"""Helpers for MCP tests: the official `mcp` client against the live daphne."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from io import StringIO
from pathlib import Path
from typing import Any

import httpx2
import pytest
from django.core.management import call_command
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

from approvals.models import ApprovalRequest
from approvals.services import decide
from dispatcher.models import ToolCall
from tests.support.factories import AgentFixture
from tests.support.live import LiveStack, free_port, stop, wait_for_port
from tests.support.paths import ROOT

FILESYSTEM = (
    ROOT
    / "var"
    / "npm"
    / "node_modules"
    / "@modelcontextprotocol"
    / "server-filesystem"
    / "dist"
    / "index.js"
)


def session_id_hook() -> tuple[
    Callable[[httpx2.Response], Awaitable[None]], Callable[[], str | None]
]:
    """An httpx2 response hook that keeps the last Mcp-Session-Id the server sent, and
    what reads it (the SDK's v2 client no longer hands it out)."""
    seen: list[str] = []

    async def keep(response: httpx2.Response) -> None:
        if value := response.headers.get("mcp-session-id"):
            seen.append(value)

    return keep, lambda: seen[-1] if seen else None


@asynccontextmanager
async def mcp_session(
    stack: LiveStack, fx: AgentFixture, *, token: str | None = None
) -> AsyncIterator[tuple[ClientSession, Callable[[], str | None]]]:
    """An initialized MCP client session on /mcp/ with the agent's token (the initialize
    handshake: a 2025-11-25 session), and what reads its Mcp-Session-Id."""
    headers = {"Authorization": f"Bearer {token or fx.token}"}
    keep, session_id = session_id_hook()
    http = httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(30, read=120),
        event_hooks={"response": [keep]},
    )
    async with http, streamable_http_client(stack.url + "/mcp/", http_client=http) as streams:
        read, write = streams
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session, session_id


def run[T](function: Callable[[], Coroutine[Any, Any, T]], timeout: float = 90) -> T:
    """Run a coroutine function on a fresh loop in its own thread (Playwright may hold a
    running loop in the test's thread)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, function()).result(timeout=timeout)


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def wait_for_pending(session_id_prefix: str = "", *, tool: str, seconds: float = 15) -> ToolCall:
    """The newest call of `tool` waiting for a reviewer (polled: the test is the reviewer)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        call = (
            ToolCall.objects.filter(name=tool, status="pending_approval")
            .filter(session__external_id__startswith=session_id_prefix)
            .order_by("-created_at")
            .first()
        )
        if call is not None:
            return call
        time.sleep(0.05)
    raise AssertionError(f"no pending call of {tool}")


def review(call: ToolCall, reviewer: Any, *, approve: bool, feedback: str = "") -> None:
    approval = ApprovalRequest.objects.get(call=call)
    decide(
        approval_id=approval.pk,
        user=reviewer,
        approve=approve,
        digest=call.digest,
        feedback=feedback,
    )


def filesystem_server() -> Path:
    if FILESYSTEM.exists():
        return FILESYSTEM
    message = (
        "@modelcontextprotocol/server-filesystem is not installed: run `make mcp-servers` "
        "(npm install into var/npm; `make test` does it)."
    )
    if os.environ.get("CI") == "true":
        pytest.fail("CI=true and " + message)
    pytest.skip(message)


UPSTREAM_SERVER = ROOT / "tests" / "support" / "mcp_upstream.py"


@pytest.fixture
def http_upstream(tmp_path: Path, settings: Any) -> Iterator[str]:
    """A streamable HTTP upstream server (tests/support/mcp_upstream.py) on a loopback
    port that this process, where servers are registered, is allowed to reach (the live
    stack's workers allow 127.0.0.1); its URL."""
    port = free_port()
    settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{port}"]
    log = tmp_path / "upstream-http.log"
    proc = subprocess.Popen(
        [sys.executable, str(UPSTREAM_SERVER), "http", str(port)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, proc, log)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


@pytest.fixture
def trusted_upstream(http_upstream: str) -> str:
    """`http_upstream` registered as a server with a fresh name and its annotations
    trusted (its echo is auto-allowed); its name."""
    name = "s" + uuid.uuid4().hex[:8]
    call_command(
        "add_mcp_server", name, "--url", http_upstream, "--trust-annotations", stdout=StringIO()
    )
    return name
