"""S14L, the ladder from S14's floor up to Harness (issue 37): what parts of Harness's own
work cost at the least we could make them cost, on the fastest database path measured
(Ha), against the same targets as S14.

S14 (bench/peer.py) shows the guarantees alone meeting issue 37's targets through
django-async-backend on the event loop (Ha). Whether Harness could meet them that way
depends on what the rest of its work for one auto-allowed upstream call costs at least.
The ladder adds two parts of it, one rung at a time, each on the loop with no thread and
as little on the call's way as we could make it (bench/peer_floor.py): the caps Harness
keeps so that one agent cannot starve the others (a wait slot per held request, in
Redis so that every process counts it; docs/security.md) with the wake-up its
dashboards and waiting requests listen to; and the MCP protocol read and made by the
official SDK (a fixed choice):

- Ha: the guarantees through django-async-backend (as in S14);
- Har: Ha with Harness's Redis commands for the call (the wait slot taken with Harness's
  own script beside the token read; the result's wake-up and the slot given back in one
  pipeline after the answer), with redis-py's asyncio client (BENCH_FLOOR_REDIS=1);
- Has: Har with the request read and the answer made with the MCP SDK's types as
  Harness's fast path does, answered as `application/json` (BENCH_FLOOR_SDK=1);
- Hass: Has answering as one SSE event, as Harness's fast path does today
  (BENCH_FLOOR_SSE=1): the official client closes an SSE answer after its message and
  opens a new connection for the next call, where it reads a JSON body to its end and
  keeps the connection (F, FastMCP's proxy, answers SSE too);
- H: Harness itself, for the distance left (policy, the repeat count, masking, the tool's
  lookup, Django's sync database layer and its threads, the ORM's objects).

The sides run in S14's interleaved rounds (bench/peer.py's `rounds`, the same order every
round) with F (FastMCP's proxy keeping one upstream session) and U (the upstream, whose
own CPU is no side's): the latency of sequential calls (p50), the throughput of 8
clients, the CPU per call of the side's own processes (its daphne and the PostgreSQL
backends of the bench database, from /proc's clock ticks; Redis's own is counted for no
side, as in S14). Its rows are Has/F against issue 37's targets; the notes give each rung
against F and against the rung below it, and H against Hass.

Its own scenario (`--only ladder`) rather than more sides of S14: eleven servers' pools
in one run would pass PostgreSQL's default of 100 connections.
"""

from __future__ import annotations

import statistics

from bench.peer import (
    CLIENTS,
    TOOL,
    UPSTREAM,
    _backends,
    _own,
    floor_chains_note,
    peers,
    register,
    rounds,
)
from bench.run import Result, Server, stop_all

# Each rung's environment on top of the floor's (bench/peer_floor.py).
RUNGS: dict[str, dict[str, str]] = {
    "Ha": {},
    "Har": {"BENCH_FLOOR_REDIS": "1"},
    "Has": {"BENCH_FLOOR_REDIS": "1", "BENCH_FLOOR_SDK": "1"},
    "Hass": {"BENCH_FLOOR_REDIS": "1", "BENCH_FLOOR_SDK": "1", "BENCH_FLOOR_SSE": "1"},
}
WHAT = {
    "Ha": "the guarantees through django-async-backend on the loop",
    "Har": "Ha with Harness's Redis commands (the wait slot beside the token read, the "
    "result's wake-up and the release after the answer)",
    "Has": "Har with the MCP SDK reading the request and making the answer (JSON)",
    "Hass": "Has answering as one SSE event, as Harness's fast path does",
    "H": "Harness",
}


def scenario_ladder(
    env: dict[str, str], creds: dict[str, str], pairs: int, quick: bool
) -> list[Result]:
    upstream, proxy, allow, env = peers(env)
    server = Server("S14L-H", env, wait=False)
    floor_env = {
        **env,
        "BENCH_FLOOR_UPSTREAM": upstream.url,
        "BENCH_FLOOR_ASYNC_DJANGO": "1",
        "DJANGO_SETTINGS_MODULE": "bench.settings_async",
    }
    rungs = {
        key: Server(
            f"S14L-{key}", {**floor_env, **extra}, wait=False, app="bench.peer_floor:application"
        )
        for key, extra in RUNGS.items()
    }
    n, warm, seconds = (20, 5, 1.5) if quick else (60, 15, 3.0)
    try:
        proxy.ready()
        register(upstream.url, allow)
        server.ready()
        for rung in rungs.values():
            rung.ready()
        token, name = creds["token"], f"{UPSTREAM}__{TOOL}"
        up = {"U": [upstream.proc.pid]}
        sides: dict[str, tuple[str, str | None, str, dict[str, list[int]]]] = {
            "F": (proxy.url, None, TOOL, {"F": [proxy.proc.pid], **up}),
            "H": (server.url + "/mcp/", token, name, {"daphne": [server.proc.pid], **up}),
            **{
                key: (rung.url + "/mcp/", token, name, {"daphne": [rung.proc.pid], **up})
                for key, rung in rungs.items()
            },
        }

        def groups_of(key: str, groups: dict[str, list[int]]) -> dict[str, list[int]]:
            return groups if key == "F" else {**groups, "postgres": _backends()}

        p50, rate, cost, session_ids = rounds(sides, pairs, n, warm, seconds, "L", groups_of)
    finally:
        stop_all([server, *rungs.values(), proxy, upstream])
    results = _results(p50, rate, cost)
    results[0].notes.append(floor_chains_note([i for key in RUNGS for i in session_ids[key]]))
    return results


def _results(
    p50: dict[str, list[float]],
    rate: dict[str, list[float]],
    cost: dict[str, list[dict[str, float]]],
) -> list[Result]:
    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    def ratio(a: list[float], b: list[float]) -> float:
        return med([x / y for x, y in zip(a, b, strict=True)])

    what = f"Has ({WHAT['Has']}, on Ha's async connection) (P) vs FastMCP's proxy (B)"
    lat = Result(f"S14L p50 latency: {what}", "us/call", False, "<= 1.5x", 1.5)
    thr = Result(f"S14L throughput ({CLIENTS} clients): {what}", "calls/s", True, ">= 0.7x", 0.7)
    cpu_r = Result(f"S14L CPU per call (own processes): {what}", "ms/call", False, "<= 2.0x", 2.0)
    own = {key: [_own(key, c) for c in cost[key]] for key in cost}
    lat.b, lat.p = p50["F"], p50["Has"]
    thr.b, thr.p = rate["F"], rate["Has"]
    cpu_r.b, cpu_r.p = own["F"], own["Has"]
    below = ""
    for key in ("Ha", "Har", "Has", "Hass", "H"):
        step = f", {key}/{below}" if below else ""
        lat.notes.append(
            f"{key} ({WHAT[key]}): p50 {med(p50[key]) / 1e3:.2f} ms, {key}/F "
            f"{ratio(p50[key], p50['F']):.2f}x"
            + (f"{step} {ratio(p50[key], p50[below]):.2f}x" if below else "")
        )
        thr.notes.append(
            f"{key}: {med(rate[key]):.1f} calls/s, {key}/F {ratio(rate[key], rate['F']):.2f}x"
            + (f"{step} {ratio(rate[key], rate[below]):.2f}x" if below else "")
        )
        cpu_r.notes.append(
            f"{key}: {med(own[key]):.2f} ms (daphne {med([c['daphne'] for c in cost[key]]):.2f}, "
            f"PostgreSQL {med([c['postgres'] for c in cost[key]]):.2f}), {key}/F "
            f"{ratio(own[key], own['F']):.2f}x"
            + (f"{step} {ratio(own[key], own[below]):.2f}x" if below else "")
        )
        below = key
    lat.notes.append(f"F p50 {med(p50['F']) / 1e3:.2f} ms")
    thr.notes.append(f"F {med(rate['F']):.1f} calls/s")
    cpu_r.notes.append(f"F {med(own['F']):.2f} ms (the proxy's process)")
    return [lat, thr, cpu_r]
