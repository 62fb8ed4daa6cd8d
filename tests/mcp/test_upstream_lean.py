"""`upstream.lean_call` (docs/mcp.md, "Execution in the workers"): a tools/call on an HTTP
server's session, sent by the awaiting task through the transport's own POST handling,
ends as the SDK's `ClientSession.call_tool` ends it: the same result, the same error and
message, the same session kept or replaced; and a call given up on sends the server the
notice that cancels it. Each case is run both ways (`upstream.LEAN_CALLS`) on a real
server: one answering JSON (tests/support/mcp_hostile_upstream.py) and one answering SSE
(the SDK's own server, tests/support/mcp_upstream.py)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools.base import ToolError
from dispatcher.tools.sources import upstream
from tests.support.live import free_port, stop, wait_for_port
from tests.support.paths import ROOT

HOSTILE = ROOT / "tests" / "support" / "mcp_hostile_upstream.py"
SDK_SERVER = ROOT / "tests" / "support" / "mcp_upstream.py"


def serve(argv: list[str], port: int, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    wait_for_port(port, proc, log)
    return proc


@pytest.fixture
def hostile(tmp_path: Path, settings: Any) -> Iterator[tuple[str, Path]]:
    port = free_port()
    settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{port}"]
    calls = tmp_path / "calls.txt"
    argv = [sys.executable, str(HOSTILE), str(port), str(calls)]
    proc = serve(argv, port, tmp_path / "hostile.log")
    try:
        yield f"http://127.0.0.1:{port}/mcp", calls
    finally:
        stop(proc)


@pytest.fixture
def sdk_server(tmp_path: Path, settings: Any) -> Iterator[str]:
    port = free_port()
    settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{port}"]
    proc = serve([sys.executable, str(SDK_SERVER), "http", str(port)], port, tmp_path / "up.log")
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


def outcomes(url: str, calls: list[tuple[str, dict[str, Any]]], timeout: float = 10) -> list[str]:
    """Each call's outcome on one pool and loop of its own, in order: its text, or its
    error's type and message; and whether the next call found the session replaced."""

    async def scenario() -> list[str]:
        pool = upstream.Pool()
        endpoint = upstream.Endpoint(
            server_id=1, version=1, name="lean", transport="http", url=url, timeout=timeout
        )
        with contextlib.suppress(upstream.DefinitionChanged):  # (the session, opened)
            await pool.call_async(endpoint, "echo", "", {"text": ""})
        definitions = pool._on_this_loop()[endpoint.key].definitions
        seen: list[str] = []
        try:
            for tool, arguments in calls:
                connection = pool._on_this_loop().get(endpoint.key)
                fingerprint = definitions[tool].fingerprint
                try:
                    result = await pool.call_async(endpoint, tool, fingerprint, arguments)
                    seen.append(f"{result.is_error} {upstream.result_text(result)}")
                except (upstream.UpstreamError, ToolError, TimeoutError) as exc:
                    seen.append(f"{type(exc).__name__}: {exc}")
                replaced = pool._on_this_loop().get(endpoint.key) is not connection
                seen.append(f"replaced: {replaced}")
        finally:
            for connection in list(pool._on_this_loop().values()):
                await connection.close()
        return seen

    return asyncio.run(scenario())


def both_ways(monkeypatch: pytest.MonkeyPatch, run: Any) -> tuple[list[str], list[str]]:
    got = {}
    for lean in (True, False):
        monkeypatch.setattr(upstream, "LEAN_CALLS", lean)
        got[lean] = run()
    return got[True], got[False]


def test_a_json_answering_servers_calls_end_the_same_both_ways(
    hostile: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = hostile
    calls: list[tuple[str, dict[str, Any]]] = [
        ("echo", {"text": "a"}),
        ("garbage", {}),  # 200 application/json that is no JSON
        ("echo", {"text": "b"}),
        ("close", {}),  # the connection cut mid-answer
        ("echo", {"text": "c"}),
        ("sleep", {"seconds": 6}),  # past its timeout
        ("echo", {"text": "d"}),
    ]
    lean, sdk = both_ways(monkeypatch, lambda: outcomes(url, calls, timeout=3))
    assert lean == sdk
    assert lean[0] == "False echo: a" and lean[-2] == "False echo: d", lean


def test_an_sse_answering_servers_calls_end_the_same_both_ways(
    sdk_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("echo", {"text": "a"}),
        ("fail", {"reason": "no"}),  # the tool's own error result
        ("echo", {"text": 7}),  # arguments the server's schema refuses
        ("slow", {"seconds": 6}),  # past its timeout
        ("echo", {"text": "b"}),
    ]
    lean, sdk = both_ways(monkeypatch, lambda: outcomes(sdk_server, calls, timeout=3))
    assert lean == sdk
    assert lean[0] == "False echo: a" and lean[-2] == "False echo: b", lean


def test_a_lean_call_given_up_on_sends_the_notice_that_cancels_it(
    hostile: tuple[str, Path],
) -> None:
    """The caller cancels a call in flight: the server is sent `notifications/cancelled`
    (the hostile server notes it when held), and the session serves the next call."""
    url, calls = hostile
    Path(f"{calls}.cancel-delay").write_text("0.1")

    async def scenario() -> str:
        pool = upstream.Pool()
        endpoint = upstream.Endpoint(
            server_id=1, version=1, name="lean", transport="http", url=url, timeout=30
        )
        with contextlib.suppress(upstream.DefinitionChanged):
            await pool.call_async(endpoint, "echo", "", {"text": ""})
        connection = pool._on_this_loop()[endpoint.key]
        assert connection.transport is not None
        assert upstream.lean_ready(connection.session, connection.transport)  # type: ignore[arg-type]
        definitions = connection.definitions
        hung = asyncio.create_task(
            pool.call_async(endpoint, "never", definitions["never"].fingerprint, {})
        )
        while not calls.exists() or "never" not in calls.read_text():
            await asyncio.sleep(0.05)
        hung.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await hung
        ends = time.monotonic() + 10
        while "cancel-held" not in calls.read_text() and time.monotonic() < ends:
            await asyncio.sleep(0.05)
        result = await pool.call_async(
            endpoint, "echo", definitions["echo"].fingerprint, {"text": "next"}
        )
        for held in pool._on_this_loop().values():
            await held.close()
        return upstream.result_text(result)

    assert asyncio.run(scenario()) == "echo: next"
    assert [line.split()[0] for line in calls.read_text().splitlines()] == [
        "never",
        "cancel-held",
        "echo",
    ]
