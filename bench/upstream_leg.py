"""A measurement of the upstream leg alone (docs/benchmarks.md, "The upstream call's
client"): one process awaits `upstream.POOL.call_async` on a FastMCP `echo` server (the
peer scenario's upstream, bench/peer_servers.py) over and over on one loop, with the
calls sent by `upstream.lean_call` (B) and by the SDK's `ClientSession.call_tool` (A) in
alternating rounds, and reports the process's CPU per call of each and their ratio B/A per
pair of rounds (median, min, max); with `--profile`, cProfile's function calls per call.

    python -m bench.upstream_leg [--calls N] [--rounds R] [--concurrency C] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import os
import pstats
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_upstream() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.peer_servers", "upstream", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    for _ in range(1200):  # (up to a minute on a loaded host)
        try:
            urllib.request.urlopen(url, timeout=1)  # noqa: S310 - the local server
        except urllib.error.HTTPError:  # (it answers: 4xx to a bare GET)
            break
        except OSError:
            time.sleep(0.05)
    return server, url


async def _measure(url: str, calls: int, rounds: int, concurrency: int, profile: bool) -> None:
    from dispatcher.tools.sources import upstream

    endpoint = upstream.Endpoint(server_id=1, version=1, name="up", transport="http", url=url)
    with contextlib.suppress(upstream.DefinitionChanged):  # (opens it: the definitions)
        await upstream.POOL.call_async(endpoint, "echo", "", {"text": "warm"})
    connection = upstream.POOL._on_this_loop()[endpoint.key]
    fingerprint = connection.definitions["echo"].fingerprint

    async def one(i: int) -> None:
        result = await upstream.POOL.call_async(endpoint, "echo", fingerprint, {"text": f"t{i}"})
        assert upstream.result_text(result) == f"t{i}", result

    async def batch(n: int) -> None:
        queue = iter(range(n))

        async def worker() -> None:
            for i in queue:
                await one(i)

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    for lean in (False, True):
        upstream.LEAN_CALLS = lean
        await batch(50)
    cpu: dict[bool, list[float]] = {False: [], True: []}
    wall: dict[bool, list[float]] = {False: [], True: []}
    for r in range(rounds):
        for lean in (False, True) if r % 2 == 0 else (True, False):
            upstream.LEAN_CALLS = lean
            started, ticked = time.process_time(), time.perf_counter()
            await batch(calls)
            cpu[lean].append((time.process_time() - started) / calls * 1e6)
            wall[lean].append((time.perf_counter() - ticked) / calls * 1e6)
    ratios = [b / a for a, b in zip(cpu[False], cpu[True], strict=True)]
    for lean, label in ((False, "A (SDK call_tool)"), (True, "B (lean_call)")):
        print(
            f"{label}: CPU per call {statistics.median(cpu[lean]):.0f} us "
            f"(rounds {', '.join(f'{x:.0f}' for x in cpu[lean])}), "
            f"wall per call {statistics.median(wall[lean]):.0f} us"
        )
    print(
        f"B/A CPU per call: median {statistics.median(ratios):.2f} "
        f"[{min(ratios):.2f}, {max(ratios):.2f}] over {rounds} pairs"
    )
    if profile:
        for lean in (False, True):
            upstream.LEAN_CALLS = lean
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            await batch(calls)
            profiler.disable()
            total = pstats.Stats(profiler).total_calls  # type: ignore[attr-defined]
            print(f"{'B' if lean else 'A'}: function calls per call {total / calls:.0f}")
    upstream.LEAN_CALLS = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    options = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "harness_site.settings")
    os.environ.setdefault("HARNESS_SECRET_KEY", "bench-upstream-leg-not-secret")
    os.environ.setdefault("HARNESS_OUTBOUND_ALLOW", "127.0.0.1")
    import django

    django.setup()
    server, url = _start_upstream()
    try:
        asyncio.run(
            _measure(url, options.calls, options.rounds, options.concurrency, options.profile)
        )
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
