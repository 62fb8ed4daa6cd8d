"""S11: an auto-allowed upstream MCP call through Harness vs the same call made directly.

Both sides use the same client (the official `mcp` ClientSession, one session kept open
for the whole side) and the same upstream server (the bundled demo MCP server,
`demo/mcp_server.py`, stdio):

- B: the client starts the upstream server itself, once for the whole side (as the
  worker keeps its own session open), and calls `word_count` directly.
- P: the client calls `bench11__word_count` on Harness's /mcp/ (daphne): admission
  (stages 1-5, a trusted-mode agent, the call and its events written), the Celery
  message, a prefork worker that claims it and calls the same upstream server over its
  own open session, the result written, the wake-up, the SSE answer.

Sequential calls (one in flight), latency per call; the ratio is P/B of the medians. Each
pair also notes the same call through the agent API (`POST ...?wait=30`), to tell the
pipeline's share from the MCP gateway's.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import time
from typing import Any

from bench import oauth
from bench.run import ROOT, Result, Server, cleanup_redis, rss_note, stop_all

UPSTREAM = "bench11"
TOOL = "word_count"
SCRIPT = ROOT / "demo" / "mcp_server.py"


def register(env: dict[str, str]) -> None:
    """The demo server as upstream `bench11`, registered in this process (the bench's
    environment is this process's; a manage.py subprocess would pay Django's start-up)."""
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    with contextlib.suppress(CommandError):
        call_command("remove_mcp_server", UPSTREAM, stdout=io.StringIO(), stderr=io.StringIO())
    call_command(
        "add_mcp_server",
        UPSTREAM,
        "--command",
        f"{sys.executable} {SCRIPT}",
        "--trust-annotations",
        stdout=io.StringIO(),
    )


async def _timed(session: Any, name: str, n: int, warm: int, tag: str) -> list[float]:
    for i in range(warm):
        await session.call_tool(name, {"text": f"warm {tag} {i}"})
    samples = []
    for i in range(n):
        started = time.perf_counter()
        result = await session.call_tool(name, {"text": f"{tag} call {i} of the bench"})
        samples.append((time.perf_counter() - started) * 1e6)
        if result.is_error:
            raise RuntimeError(f"{name} failed: {result.content}")
    return samples


async def through_harness(url: str, token: str, n: int, warm: int, tag: str) -> list[float]:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    async with http, streamable_http_client(url + "/mcp/", http_client=http) as streams:
        read, write = streams
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await _timed(session, f"{UPSTREAM}__{TOOL}", n, warm, tag)


async def _pairs(
    url: str, token: str, pairs: int, n: int, warm: int, result: Result, bearer: str = ""
) -> None:
    """B P B P ...: B on one session with the upstream server, started once for the whole
    side (as the worker keeps its own), P on a new /mcp/ session per pair."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=sys.executable, args=[str(SCRIPT)])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as direct:
        await direct.initialize()
        for pair in range(pairs):
            b = await _timed(direct, TOOL, n, warm, f"b{pair}")
            p = await through_harness(url, token, n, warm, f"p{pair}")
            result.b.append(statistics.median(b))
            result.p.append(statistics.median(p))
            api = await asyncio.to_thread(through_api, url, bearer or token, n, warm, f"a{pair}")
            result.notes.append(
                f"pair {pair + 1} p95: B {sorted(b)[int(0.95 * len(b))]:.0f} us, "
                f"P {sorted(p)[int(0.95 * len(p))]:.0f} us; the same call through the agent "
                f"API (?wait=30): median {statistics.median(api):.0f} us"
            )


def through_api(url: str, token: str, n: int, warm: int, tag: str) -> list[float]:
    """The same upstream call through the agent API (POST ...?wait=30): what part of P is
    the pipeline, what part the MCP gateway."""
    import httpx

    name = f"{UPSTREAM}__{TOOL}"
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
        session = c.post("/api/v1/sessions", json={"title": "S11 API"}).json()["id"]
        samples = []
        for i in range(warm + n):
            body = {
                "calls": [{"id": f"{tag}-{i}", "name": name, "arguments": {"text": f"{tag} {i}"}}]
            }
            started = time.perf_counter()
            response = c.post(f"/api/v1/sessions/{session}/calls", params={"wait": 30}, json=body)
            if response.status_code != 200:
                raise RuntimeError(f"API call failed: {response.status_code} {response.text[:300]}")
            if i >= warm:
                samples.append((time.perf_counter() - started) * 1e6)
    return samples


def scenario_mcp(env: dict[str, str], creds: dict[str, str], pairs: int, quick: bool) -> Result:
    from bench.live import Worker

    cleanup_redis()
    register(env)
    server, worker = Server("S11", env, wait=False), Worker(env, wait=False)
    server.ready()
    worker.ready()
    n, warm = (10, 3) if quick else (60, 20)
    result = Result(
        name=f"S11 upstream MCP call: Harness /mcp/ (P) vs direct to the server (B), {n} sequential calls per side",
        unit="us/call",
        higher_is_better=False,
        target="<= 4.0x",  # issue 16: p50 through /mcp/ at most 4x the direct call
        target_value=4.0,
    )
    try:
        token = oauth.token_for(env, creds["token"], server.url)
        result.notes.append(f"P's token: {oauth.kind()} (BENCH_TOKEN_KIND)")
        asyncio.run(_pairs(server.url, token, pairs, n, warm, result, creds["token"]))
        result.notes.append(rss_note([server]))
        result.notes.append(worker.rss_note())
    finally:
        stop_all([worker, server])
    return result
