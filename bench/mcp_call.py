"""Harness's own CPU per auto-allowed `/mcp/` call, in one process, without daphne
(docs/benchmarks.md, "The MCP allowed call's ORM trips"): the gateway's ASGI app
(`mcp_http.application`) is awaited with S14's `tools/call` request (`up__echo` on the peer
scenario's FastMCP upstream, a trusted agent, a known session) over and over on one loop,
its ORM trips on the gateway's threads, against the database and Redis the environment
names. Reports the process's CPU (all its threads) and wall time per call, per round and
their medians; with `--profile`, cProfile's top functions (cumulative, a CPU clock) over
one more round.

    DATABASE_URL=... REDIS_URL=... python -m bench.mcp_call [--calls N] [--rounds R]
        [--concurrency C] [--profile]

The database must be migrated; a new agent of a trusted user `mcp-call` is made and the upstream registered as `up` on each run.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import secrets
import statistics
import time
from typing import Any

from bench.upstream_leg import _start_upstream

PROTOCOL = "2025-06-18"


def _agent_token() -> str:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    user, _ = get_user_model().objects.get_or_create(username="mcp-call")
    call_command("set_mode", user.username, "trusted", stdout=io.StringIO())
    out = io.StringIO()
    name = f"mcp-call-{secrets.token_hex(4)}"
    call_command("create_agent", name, "--owner", user.username, stdout=out)
    return out.getvalue().strip().splitlines()[-1]


def _scope(token: str, session_id: str | None) -> dict[str, Any]:
    headers = [
        (b"host", b"127.0.0.1"),
        (b"authorization", f"Bearer {token}".encode()),
        (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream"),
        (b"mcp-protocol-version", PROTOCOL.encode()),
    ]
    if session_id:
        headers.append((b"mcp-session-id", session_id.encode()))
    return {
        "type": "http",
        "method": "POST",
        "path": "/mcp/",
        "scheme": "http",
        "headers": headers,
        "query_string": b"",
    }


async def _post(scope: dict[str, Any], body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    """`body` posted to the gateway's app; its status, headers and body."""
    from dispatcher.gateways import mcp_http

    sent = False
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    status, headers, chunks = 0, {}, []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = {k.decode(): v.decode() for k, v in message["headers"]}
        else:
            chunks.append(message.get("body", b""))

    await mcp_http.application(scope, receive, send)
    done.set()
    return status, headers, b"".join(chunks)


async def _measure(token: str, calls: int, rounds: int, concurrency: int, profile: bool) -> None:
    initialize = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "mcp-call", "version": "1"},
        },
    }
    sessions = []
    for _ in range(concurrency):
        status, headers, _ = await _post(_scope(token, None), initialize)
        assert status == 200, status
        sessions.append(headers["mcp-session-id"])
    counter = iter(range(1, 10**9))

    async def one(session_id: str) -> None:
        n = next(counter)
        request = {
            "jsonrpc": "2.0",
            "id": n,
            "method": "tools/call",
            "params": {"name": "up__echo", "arguments": {"text": f"t{n}"}},
        }
        status, _, body = await _post(_scope(token, session_id), request)
        assert status == 200 and f'"t{n}"' in body.decode(), (status, body[:300])

    async def batch(n: int) -> None:
        async def worker(session_id: str) -> None:
            for _ in range(n // concurrency):
                await one(session_id)

        await asyncio.gather(*(worker(s) for s in sessions))

    await batch(max(40, concurrency * 5))  # (warm: the upstream's connection, the caches)
    cpu, wall = [], []
    for _ in range(rounds):
        started, ticked = time.process_time(), time.perf_counter()
        await batch(calls)
        cpu.append((time.process_time() - started) / calls * 1e6)
        wall.append((time.perf_counter() - ticked) / calls * 1e6)
    print(
        f"CPU per call {statistics.median(cpu):.0f} us "
        f"(rounds {', '.join(f'{x:.0f}' for x in cpu)}), "
        f"wall per call {statistics.median(wall):.0f} us, load {os.getloadavg()[0]:.1f}"
    )
    if profile:
        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
        await batch(calls)
        profiler.disable()
        stats = pstats.Stats(profiler)
        print(f"function calls per call {stats.total_calls / calls:.0f}")  # type: ignore[attr-defined]
        stats.sort_stats("cumulative").print_stats(60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    options = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "harness_site.settings")
    for name, value in (
        ("HARNESS_AGENT_REQUESTS_PER_SECOND", "0"),
        ("HARNESS_PERSON_REQUESTS_PER_SECOND", "0"),
        ("HARNESS_MAX_SESSIONS_PER_MINUTE", "0"),
        ("HARNESS_MCP_RUN_IDLE", "0"),
        ("HARNESS_LOG_LEVEL", "ERROR"),
    ):
        os.environ.setdefault(name, value)
    server, url = _start_upstream()
    allow = url.split("//")[1].split("/")[0]
    os.environ["HARNESS_OUTBOUND_ALLOW"] = allow
    import django

    django.setup()
    try:
        from bench.peer import register

        register(url, allow)
        token = _agent_token()
        asyncio.run(
            _measure(token, options.calls, options.rounds, options.concurrency, options.profile)
        )
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
