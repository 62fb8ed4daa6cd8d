"""S14, Harness against its peer (issue 37): the same read-only `echo` tool of one FastMCP
upstream server (Streamable HTTP, bench/peer_servers.py) called three ways, with one client
library, the official `mcp` SDK (`streamable_http_client` + `ClientSession`):

- U: the upstream directly;
- F: FastMCP's proxy of it, keeping one upstream session (a connected `Client` handed to
  `create_proxy`);
- H: Harness's /mcp/ (daphne, a prefork -c 2 worker, PostgreSQL), the upstream registered
  as `up` with `--trust-annotations`, a trusted-mode agent: `up__echo` is auto-allowed.

In interleaved rounds (U F H, U F H, ...), each side per round: the latency of sequential
calls on one open session (p50), then the throughput of 8 clients (8 sessions, each one
call in flight) for a fixed time, and the CPU per call of the side's own processes during
that time, read from /proc: U the upstream; F the proxy; H the daphne, the worker (main
and pool children) and the PostgreSQL backends connected to the bench database. The
upstream's own CPU per call in F's and H's rounds is printed beside them. Ratios H/F per
round; the median of the rounds against issue 37's targets.

S14f, the floor of the guarantees (bench/peer_floor.py), two more sides in the same rounds:
Hf, a raw ASGI app on daphne doing only what Harness must do for the call (the token
read, the call stored with its digest, decided and claimed with its three audit events in
one durable transaction before the upstream call, the upstream call on one kept session,
the result with its event in a second durable transaction), CPU its daphne and the
PostgreSQL backends; and Hf-uvicorn, the same app on uvicorn (F's server). Hf/F per
round against the same targets: a target Hf/F misses is out of reach on this stack
without giving up a guarantee or daphne; H/Hf is Harness above its floor. In the notes,
the same floor through Django's database layer: Hd, its sync layer on threads in
Harness's trips, and Ha, django-async-backend on the event loop (bench/README.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from bench.run import DB_NAME, PG_ADMIN_URL, ROOT, Result, Server, cleanup_redis, stop_all

UPSTREAM = "up"
TOOL = "echo"
CLIENTS = 8


class Peer:
    """A bench/peer_servers.py process on loopback (or, with `argv`, that command with
    PORT in it replaced by the port), started and stopped by PID."""

    def __init__(
        self,
        label: str,
        *args: str,
        argv: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.label = label
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        if argv is None:
            argv = ["-m", "bench.peer_servers", args[0], "PORT", *args[1:]]
        self.proc = subprocess.Popen(
            [sys.executable, *(str(self.port) if a == "PORT" else a for a in argv)],
            cwd=ROOT,
            env={**(env or os.environ), "PYTHONPATH": str(ROOT), "FASTMCP_LOG_LEVEL": "ERROR"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"{self.label} exited: {err[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.label} did not listen on {self.port}")


def _cpu_of(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _backends() -> list[int]:
    """The PostgreSQL backends connected to the bench database (not the machine's others:
    other engineers' tests share this PostgreSQL)."""
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (DB_NAME,)
        ).fetchall()
    return [int(r[0]) for r in rows]


def cpu(groups: dict[str, list[int]]) -> dict[str, dict[int, float]]:
    return {name: {pid: _cpu_of(pid) for pid in pids} for name, pids in groups.items()}


def cpu_ms_per_call(
    before: dict[str, dict[int, float]], after: dict[str, dict[int, float]], calls: int
) -> dict[str, float]:
    """Per group, the CPU its processes used between the snapshots, per call (a process
    that appeared in between counts from zero)."""
    return {
        name: sum(t - before[name].get(pid, 0.0) for pid, t in after[name].items()) / calls * 1e3
        for name in after
    }


# --- the client: the official SDK, one session per client -----------------------------------


@contextlib.asynccontextmanager
async def client_session(
    url: str, token: str | None, ids: list[str] | None = None
) -> AsyncIterator[Any]:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    seen: list[str] = []

    async def keep(response: Any) -> None:  # (the SDK's v2 client hands out no session id)
        if value := response.headers.get("mcp-session-id"):
            seen.append(value)

    http = httpx2.AsyncClient(headers=headers, timeout=60, event_hooks={"response": [keep]})
    async with http, streamable_http_client(url, http_client=http) as streams:
        read, write = streams
        async with ClientSession(read, write) as session:
            await session.initialize()
            if ids is not None:
                ids.append(seen[-1] if seen else "")
            yield session


async def _call(session: Any, name: str, text: str) -> None:
    result = await session.call_tool(name, {"text": text})
    if result.is_error:
        raise RuntimeError(f"{name} failed: {result.content}")


async def latency(
    url: str, token: str | None, name: str, n: int, warm: int, tag: str, ids: list[str]
) -> list[float]:
    """`n` sequential calls on one open session after `warm`; microseconds each. The
    session's Mcp-Session-Id is appended to `ids`."""
    async with client_session(url, token, ids) as session:
        for i in range(warm):
            await _call(session, name, f"warm {tag} {i}")
        samples = []
        for i in range(n):
            started = time.perf_counter()
            await _call(session, name, f"{tag} call {i}")
            samples.append((time.perf_counter() - started) * 1e6)
    return samples


async def throughput(
    url: str, token: str | None, name: str, seconds: float, tag: str, measure: Any
) -> tuple[float, int, Any]:
    """CLIENTS sessions, opened first, then each one call in flight for `seconds`:
    (calls/s, calls, what `measure()` returned around the timed part)."""
    async with contextlib.AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(client_session(url, token)) for _ in range(CLIENTS)
        ]
        for i, s in enumerate(sessions):  # each session warm
            await _call(s, name, f"warm {tag} {i}")
        done = [0] * CLIENTS
        before = measure()
        started = time.perf_counter()
        until = started + seconds

        async def loop(k: int) -> None:
            while time.perf_counter() < until:
                await _call(sessions[k], name, f"{tag} c{k} {done[k]}")
                done[k] += 1

        await asyncio.gather(*(loop(k) for k in range(CLIENTS)))
        took = time.perf_counter() - started
        after = measure()
    calls = sum(done)
    return calls / took, calls, (before, after)


Sides = dict[str, tuple[str, str | None, str, dict[str, list[int]]]]


def _leaf(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (the SDK client nests one in another)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def rounds(
    sides: Sides,
    pairs: int,
    n: int,
    warm: int,
    seconds: float,
    tag: str,
    groups_of: Callable[[str, dict[str, list[int]]], dict[str, list[int]]],
) -> tuple[
    dict[str, list[float]],
    dict[str, list[float]],
    dict[str, list[dict[str, float]]],
    dict[str, list[str]],
]:
    """`pairs` interleaved rounds of every side (url, token, tool, its processes): the p50
    of `n` sequential calls after `warm`, then the throughput of CLIENTS clients for
    `seconds` with the CPU per call of the processes `groups_of(side, its processes)`
    names, read around it. Per side: the p50s, the rates, the CPU, the latency sessions'
    Mcp-Session-Ids."""
    p50: dict[str, list[float]] = {k: [] for k in sides}
    rate: dict[str, list[float]] = {k: [] for k in sides}
    cost: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
    session_ids: dict[str, list[str]] = {k: [] for k in sides}
    for round_ in range(pairs):
        for key, (url, tok, name, groups) in sides.items():

            def measure(key: str = key, groups: dict[str, list[int]] = groups) -> Any:
                return cpu(groups_of(key, groups))

            label = f"{tag}{key}{round_}"
            try:
                samples = asyncio.run(latency(url, tok, name, n, warm, label, session_ids[key]))
                p50[key].append(statistics.median(samples))
                per_s, calls, (before, after) = asyncio.run(
                    throughput(url, tok, name, seconds, f"t{label}", measure)
                )
            except Exception as exc:  # (the SDK's task groups nest the cause past printing)
                raise RuntimeError(f"side {key}, round {round_}: {_leaf(exc)!r}") from exc
            rate[key].append(per_s)
            cost[key].append(cpu_ms_per_call(before, after, calls))
    return p50, rate, cost, session_ids


# --- the scenario --------------------------------------------------------------------------


def register(url: str, allow: str) -> None:
    """The upstream as `up` (its annotations trusted: `echo` is read-only), in this process,
    its loopback address allowed (floor.outbound refuses loopback otherwise)."""
    from django.core.management import call_command
    from django.core.management.base import CommandError
    from django.test import override_settings

    with override_settings(HARNESS_OUTBOUND_ALLOW=[allow]):
        with contextlib.suppress(CommandError):
            call_command("remove_mcp_server", UPSTREAM, stdout=io.StringIO(), stderr=io.StringIO())
        call_command(
            "add_mcp_server", UPSTREAM, "--url", url, "--trust-annotations", stdout=io.StringIO()
        )


def peers(env: dict[str, str]) -> tuple[Peer, Peer, str, dict[str, str]]:
    """A scenario's start (Redis's bench keys cleared): the upstream (ready), FastMCP's
    proxy of it (starting), the upstream's address for the outbound door, and `env` with
    it allowed (this scenario's servers only)."""
    cleanup_redis()
    upstream = Peer("upstream", "upstream")
    upstream.ready()
    proxy = Peer("proxy", "proxy", upstream.url)
    allow = f"127.0.0.1:{upstream.port}"
    return upstream, proxy, allow, {**env, "HARNESS_OUTBOUND_ALLOW": allow}


def scenario_peer(
    env: dict[str, str], creds: dict[str, str], pairs: int, quick: bool
) -> list[Result]:
    from bench.live import Worker

    upstream, proxy, allow, env = peers(env)
    # H0: this checkout without the inline lane, or another checkout (the code before a
    # change: BENCH_PEER_BASELINE=PATH), whose worker then serves both (H sends it none).
    baseline = Path(os.environ.get("BENCH_PEER_BASELINE") or ROOT)
    server = Server("S14", env, wait=False)
    worker = Worker({**env, "PYTHONPATH": str(baseline)}, wait=False, root=baseline)
    # (BENCH_PEER_BASELINE_INLINE=1: that checkout with its inline lane, to compare
    # two versions of H in the same rounds: H/H0 is then the change's own ratio.)
    lane = {} if os.environ.get("BENCH_PEER_BASELINE_INLINE") == "1" else {"BENCH_NO_INLINE": "1"}
    queued = Server(
        "S14-H0",
        {**env, **lane, "PYTHONPATH": str(baseline)},
        wait=False,
        root=baseline,
    )
    # S14f: the floor of the guarantees (bench/peer_floor.py) on daphne and on uvicorn.
    floor_env = {**env, "BENCH_FLOOR_UPSTREAM": upstream.url}
    floor = Server("S14-Hf", floor_env, wait=False, app="bench.peer_floor:application")
    floor_uvicorn = Peer(
        "S14-Hf-uvicorn",
        argv=[
            *("-m", "uvicorn", "bench.peer_floor:application", "--host", "127.0.0.1"),
            *("--port", "PORT", "--lifespan", "off", "--log-level", "error", "--no-access-log"),
        ],
        env=floor_env,
    )
    # Hd: the floor's statements through Django's database layer on threads, in Harness's
    # trips (bench/peer_floor.py, BENCH_FLOOR_DJANGO=1).
    django_floor = Server(
        "S14-Hd",
        {**floor_env, "BENCH_FLOOR_DJANGO": "1"},
        wait=False,
        app="bench.peer_floor:application",
    )
    # Ha: the same through django-async-backend's async connection, on the loop.
    async_floor = Server(
        "S14-Ha",
        {
            **floor_env,
            "BENCH_FLOOR_ASYNC_DJANGO": "1",
            "DJANGO_SETTINGS_MODULE": "bench.settings_async",
        },
        wait=False,
        app="bench.peer_floor:application",
    )
    # On request (BENCH_PEER_PROXY_FLOOR=1), Hp: the same app with no guarantees (no
    # database at all), a bare proxy on daphne.
    bare = None
    if os.environ.get("BENCH_PEER_PROXY_FLOOR") == "1":
        bare_env = {**floor_env, "BENCH_FLOOR_GUARANTEES": "0"}
        bare = Server("S14-Hp", bare_env, wait=False, app="bench.peer_floor:application")
    n, warm, seconds = (20, 5, 1.5) if quick else (60, 15, 3.0)
    try:
        proxy.ready()
        register(upstream.url, allow)
        server.ready()
        queued.ready()
        floor.ready()
        floor_uvicorn.ready()
        django_floor.ready()
        async_floor.ready()
        if bare is not None:
            bare.ready()
        worker.ready()
        token = creds["token"]
        name = f"{UPSTREAM}__{TOOL}"
        up = {"U": [upstream.proc.pid]}
        sides: dict[str, tuple[str, str | None, str, dict[str, Any]]] = {
            "U": (upstream.url, None, TOOL, up),
            "F": (proxy.url, None, TOOL, {"F": [proxy.proc.pid], **up}),
            "H": (server.url + "/mcp/", token, name, {}),
            "H0": (queued.url + "/mcp/", token, name, {}),
            "Hf": (floor.url + "/mcp/", token, name, {"daphne": [floor.proc.pid], **up}),
            "Hf-uvicorn": (
                floor_uvicorn.url,
                token,
                name,
                {"uvicorn": [floor_uvicorn.proc.pid], **up},
            ),
        }
        sides["Hd"] = (
            django_floor.url + "/mcp/",
            token,
            name,
            {"daphne": [django_floor.proc.pid], **up},
        )
        sides["Ha"] = (
            async_floor.url + "/mcp/",
            token,
            name,
            {"daphne": [async_floor.proc.pid], **up},
        )
        if bare is not None:
            sides["Hp"] = (bare.url + "/mcp/", token, name, {"daphne": [bare.proc.pid], **up})

        def groups_of(key: str, groups: dict[str, list[int]]) -> dict[str, list[int]]:
            if key in ("H", "H0"):
                return {
                    "daphne": [(server if key == "H" else queued).proc.pid],
                    "worker": worker.pids(),
                    "postgres": _backends(),
                    "U": [upstream.proc.pid],
                }
            if key.startswith("Hf") or key in ("Hd", "Ha", "Hp"):
                return {**groups, "postgres": _backends()}
            return groups

        p50, rate, cost, session_ids = rounds(sides, pairs, n, warm, seconds, "", groups_of)
    finally:
        stop_all(
            [
                worker,
                server,
                queued,
                floor,
                floor_uvicorn,
                django_floor,
                async_floor,
                *([bare] if bare else []),
                proxy,
                upstream,
            ]
        )
    results = _results(p50, rate, cost, n, seconds) + _floor_results(p50, rate, cost)
    if baseline != ROOT:
        results[0].notes.append(f"H0 ran the checkout at {baseline} (BENCH_PEER_BASELINE)")
    for key in ("H", "H0"):
        results[0].notes.append(
            f"{key}: " + stages_note(session_ids[key], statistics.median(p50[key]))
        )
    results[3].notes.append(
        floor_chains_note(
            session_ids["Hf"] + session_ids["Hf-uvicorn"] + session_ids["Hd"] + session_ids["Ha"]
        )
    )
    return results


def floor_chains_note(external_ids: list[str]) -> str:
    """The floor's records of its latency rounds, checked as Harness's are: the calls
    completed, and their sessions' chains verified (hashes, order, signed heads)."""
    from audit.verify import verify_database
    from dispatcher.models import AgentSession, ToolCall

    chains = [
        str(pk)
        for pk in AgentSession.objects.filter(
            client="mcp", external_id__in=external_ids
        ).values_list("pk", flat=True)
    ]
    calls = ToolCall.objects.filter(session__client="mcp", session__external_id__in=external_ids)
    completed = calls.filter(status="completed", attempts=1).count()
    events = problems = 0
    for chain in chains:
        report = verify_database(chain)
        events += report.events
        problems += len(report.problems)
    return (
        f"the floor's records (latency rounds): {completed} of {calls.count()} calls completed "
        f"once; {len(chains)} chains, {events} events verified, {problems} problems"
    )


def stages_note(external_ids: list[str], p50_us: float) -> str:
    """Where H's time goes, from its own audit times (the latency rounds' calls, medians):
    admission (call.received to call.allowed), to the claim (allowed to call.started: for
    a worker, the commit, the message, the pickup and the claim's own transaction), the
    run (started to call.completed: the upstream call and the result's transaction), and
    the rest of the client's p50 (the way in before the call is received and the way out
    after its result is written)."""
    from audit.models import AuditEvent
    from dispatcher.models import ToolCall

    # (An Mcp-Session-Id may add "~" and its transport session's part to the session's id.)
    external = {sid.rpartition("~")[0] or sid for sid in external_ids}
    calls = ToolCall.objects.filter(
        session__external_id__in=external, name=f"{UPSTREAM}__{TOOL}"
    ).values_list("pk", flat=True)
    times: dict[str, dict[str, Any]] = {}
    events = AuditEvent.objects.filter(
        subject__in=[f"call:{pk}" for pk in calls],
        kind__in=["call.received", "call.allowed", "call.started", "call.completed"],
    ).values_list("subject", "kind", "created_at")
    for subject, kind, at in events:
        times.setdefault(subject, {})[kind] = at
    spans: dict[str, list[float]] = {
        "admission": [],
        "to the claim": [],
        "the run": [],
        "in all": [],
    }
    for t in times.values():
        if len(t) < 4:
            continue
        spans["admission"].append((t["call.allowed"] - t["call.received"]).total_seconds())
        spans["to the claim"].append((t["call.started"] - t["call.allowed"]).total_seconds())
        spans["the run"].append((t["call.completed"] - t["call.started"]).total_seconds())
        spans["in all"].append((t["call.completed"] - t["call.received"]).total_seconds())
    if not spans["in all"]:
        return "H's stages: no audit times found"
    med = {k: statistics.median(v) * 1e3 for k, v in spans.items()}
    return (
        f"H's time from its audit events ({len(spans['in all'])} calls, medians): admission "
        f"{med['admission']:.2f} ms, to the claim {med['to the claim']:.2f} ms, the run (upstream "
        f"call and result) {med['the run']:.2f} ms, received to completed {med['in all']:.2f} ms; "
        f"the rest of the p50 (way in and way out) {p50_us / 1e3 - med['in all']:.2f} ms"
    )


def _own(side: str, c: dict[str, float]) -> float:
    """CPU per call of the side's own processes (the upstream's is not the side's)."""
    return sum(v for k, v in c.items() if k != "U" or side == "U")


def _results(
    p50: dict[str, list[float]],
    rate: dict[str, list[float]],
    cost: dict[str, list[dict[str, float]]],
    n: int,
    seconds: float,
) -> list[Result]:
    what = (
        "Harness /mcp/ auto-allowed up__echo (P) vs FastMCP's proxy keeping one upstream "
        "session (B), same upstream, official mcp client"
    )
    lat = Result(
        f"S14 peer p50 latency ({n} sequential calls): {what}", "us/call", False, "<= 1.5x", 1.5
    )
    thr = Result(
        f"S14 peer throughput ({CLIENTS} clients, {seconds:g} s): {what}",
        "calls/s",
        True,
        ">= 0.7x",
        0.7,
    )
    cpu_r = Result(
        f"S14 peer CPU per call (own processes): {what}", "ms/call", False, "<= 2.0x", 2.0
    )
    lat.b, lat.p = p50["F"], p50["H"]
    thr.b, thr.p = rate["F"], rate["H"]
    cpu_r.b = [_own("F", c) for c in cost["F"]]
    cpu_r.p = [_own("H", c) for c in cost["H"]]

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    def ratio(a: list[float], b: list[float]) -> float:
        return med([x / y for x, y in zip(a, b, strict=True)])

    u_cpu = [_own("U", c) for c in cost["U"]]
    h0_cpu = [_own("H0", c) for c in cost["H0"]]
    lat.notes.append(
        f"U, the upstream directly: p50 {med(p50['U']) / 1e3:.2f} ms; F/U {ratio(p50['F'], p50['U']):.2f}x, "
        f"H/U {ratio(p50['H'], p50['U']):.2f}x (medians of the rounds' ratios); H0, Harness "
        f"without the inline lane (every call through the queue and the worker): p50 "
        f"{med(p50['H0']) / 1e3:.2f} ms, H0/F {ratio(p50['H0'], p50['F']):.2f}x, "
        f"H/H0 {ratio(p50['H'], p50['H0']):.2f}x"
    )
    thr.notes.append(
        f"U: {med(rate['U']):.0f} calls/s; F/U {ratio(rate['F'], rate['U']):.2f}x, "
        f"H/U {ratio(rate['H'], rate['U']):.2f}x; H0: {med(rate['H0']):.1f} calls/s, "
        f"H0/F {ratio(rate['H0'], rate['F']):.2f}x, H/H0 {ratio(rate['H'], rate['H0']):.2f}x"
    )
    for key in ("H", "H0"):
        parts = {
            k: statistics.median(c.get(k, 0.0) for c in cost[key])
            for k in ("daphne", "worker", "postgres", "U")
        }
        cpu_r.notes.append(
            f"{key} by process: daphne {parts['daphne']:.2f}, worker {parts['worker']:.2f}, "
            f"PostgreSQL backends of the bench database {parts['postgres']:.2f} ms; the "
            f"upstream's in {key}'s rounds {parts['U']:.2f} ms"
        )
    cpu_r.notes.append(
        f"U, the upstream alone (its own calls): {med(u_cpu):.2f} ms; the upstream's in F's "
        f"rounds {med([c['U'] for c in cost['F']]):.2f} ms; H0 {med(h0_cpu):.2f} ms, "
        f"H0/F {ratio(h0_cpu, cpu_r.b):.2f}x"
    )
    return [lat, thr, cpu_r]


def _floor_results(
    p50: dict[str, list[float]],
    rate: dict[str, list[float]],
    cost: dict[str, list[dict[str, float]]],
) -> list[Result]:
    """S14f: Hf (the guarantees alone on daphne, bench/peer_floor.py) against F per round,
    against the same targets: a target Hf/F misses is out of reach on this stack without
    giving up a guarantee or daphne. Notes: H above its floor (H/Hf), and the same floor
    on uvicorn (Hf-uvicorn/F, and Hf/Hf-uvicorn: daphne's share)."""
    what = (
        "the floor of H's guarantees on daphne (bench/peer_floor.py: token read, call + "
        "3 events durable before the upstream call, result + event durable; raw SQL) (P) vs "
        "FastMCP's proxy (B)"
    )

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    def ratio(a: list[float], b: list[float]) -> float:
        return med([x / y for x, y in zip(a, b, strict=True)])

    uv = "Hf-uvicorn"
    lat = Result(f"S14f p50 latency: {what}", "us/call", False, "<= 1.5x", 1.5)
    lat.b, lat.p = p50["F"], p50["Hf"]
    thr = Result(f"S14f throughput ({CLIENTS} clients): {what}", "calls/s", True, ">= 0.7x", 0.7)
    thr.b, thr.p = rate["F"], rate["Hf"]
    cpu_r = Result(f"S14f CPU per call (own processes): {what}", "ms/call", False, "<= 2.0x", 2.0)
    cpu_r.b = [_own("F", c) for c in cost["F"]]
    cpu_r.p = [_own("Hf", c) for c in cost["Hf"]]
    h_cpu = [_own("H", c) for c in cost["H"]]
    uv_cpu = [_own(uv, c) for c in cost[uv]]
    lat.notes.append(
        f"Hf p50 {med(p50['Hf']) / 1e3:.2f} ms; H/Hf {ratio(p50['H'], p50['Hf']):.2f}x (Harness "
        f"above its floor); {uv}: p50 {med(p50[uv]) / 1e3:.2f} ms, {uv}/F "
        f"{ratio(p50[uv], p50['F']):.2f}x, Hf/{uv} {ratio(p50['Hf'], p50[uv]):.2f}x"
    )
    thr.notes.append(
        f"Hf {med(rate['Hf']):.1f} calls/s; H/Hf {ratio(rate['H'], rate['Hf']):.2f}x; {uv}: "
        f"{med(rate[uv]):.1f} calls/s, {uv}/F {ratio(rate[uv], rate['F']):.2f}x, "
        f"Hf/{uv} {ratio(rate['Hf'], rate[uv]):.2f}x"
    )
    hf_daphne = med([c["daphne"] for c in cost["Hf"]])
    hf_pg = med([c["postgres"] for c in cost["Hf"]])
    uv_server = med([c["uvicorn"] for c in cost[uv]])
    uv_pg = med([c["postgres"] for c in cost[uv]])
    cpu_r.notes.append(
        f"Hf by process: daphne {hf_daphne:.2f}, PostgreSQL backends {hf_pg:.2f} ms; the "
        f"upstream's in Hf's rounds {med([c['U'] for c in cost['Hf']]):.2f} ms; H/Hf "
        f"{ratio(h_cpu, cpu_r.p):.2f}x"
    )
    cpu_r.notes.append(
        f"{uv}: {med(uv_cpu):.2f} ms (uvicorn {uv_server:.2f}, PostgreSQL {uv_pg:.2f}), "
        f"{uv}/F {ratio(uv_cpu, cpu_r.b):.2f}x, Hf/{uv} {ratio(cpu_r.p, uv_cpu):.2f}x"
    )
    hd_cpu = [_own("Hd", c) for c in cost["Hd"]]
    hd_daphne = med([c["daphne"] for c in cost["Hd"]])
    lat.notes.append(
        f"Hd, the floor through Django's database layer on threads (BENCH_FLOOR_DJANGO): p50 "
        f"{med(p50['Hd']) / 1e3:.2f} ms, Hd/F {ratio(p50['Hd'], p50['F']):.2f}x, Hd/Hf "
        f"{ratio(p50['Hd'], p50['Hf']):.2f}x, H/Hd {ratio(p50['H'], p50['Hd']):.2f}x"
    )
    thr.notes.append(
        f"Hd: {med(rate['Hd']):.1f} calls/s, Hd/F {ratio(rate['Hd'], rate['F']):.2f}x, Hd/Hf "
        f"{ratio(rate['Hd'], rate['Hf']):.2f}x, H/Hd {ratio(rate['H'], rate['Hd']):.2f}x"
    )
    cpu_r.notes.append(
        f"Hd: {med(hd_cpu):.2f} ms (daphne {hd_daphne:.2f}, PostgreSQL "
        f"{med([c['postgres'] for c in cost['Hd']]):.2f}), Hd/F {ratio(hd_cpu, cpu_r.b):.2f}x, "
        f"Hd/Hf {ratio(hd_cpu, cpu_r.p):.2f}x, H/Hd {ratio(h_cpu, hd_cpu):.2f}x"
    )
    ha_cpu = [_own("Ha", c) for c in cost["Ha"]]
    lat.notes.append(
        f"Ha, the floor through django-async-backend on the loop (BENCH_FLOOR_ASYNC_DJANGO): "
        f"p50 {med(p50['Ha']) / 1e3:.2f} ms, Ha/F {ratio(p50['Ha'], p50['F']):.2f}x, Ha/Hf "
        f"{ratio(p50['Ha'], p50['Hf']):.2f}x"
    )
    thr.notes.append(
        f"Ha: {med(rate['Ha']):.1f} calls/s, Ha/F {ratio(rate['Ha'], rate['F']):.2f}x, Ha/Hf "
        f"{ratio(rate['Ha'], rate['Hf']):.2f}x"
    )
    cpu_r.notes.append(
        f"Ha: {med(ha_cpu):.2f} ms (daphne {med([c['daphne'] for c in cost['Ha']]):.2f}, "
        f"PostgreSQL {med([c['postgres'] for c in cost['Ha']]):.2f}), Ha/F "
        f"{ratio(ha_cpu, cpu_r.b):.2f}x, Ha/Hf {ratio(ha_cpu, cpu_r.p):.2f}x"
    )
    if "Hp" in p50:  # the bare proxy on daphne (BENCH_PEER_PROXY_FLOOR=1)
        hp_cpu = [_own("Hp", c) for c in cost["Hp"]]
        lat.notes.append(
            f"Hp, the same app with no guarantees (no database) on daphne: p50 "
            f"{med(p50['Hp']) / 1e3:.2f} ms, Hp/F {ratio(p50['Hp'], p50['F']):.2f}x, "
            f"Hf/Hp {ratio(p50['Hf'], p50['Hp']):.2f}x"
        )
        thr.notes.append(
            f"Hp: {med(rate['Hp']):.1f} calls/s, Hp/F {ratio(rate['Hp'], rate['F']):.2f}x, "
            f"Hf/Hp {ratio(rate['Hf'], rate['Hp']):.2f}x"
        )
        cpu_r.notes.append(
            f"Hp: {med(hp_cpu):.2f} ms (daphne {med([c['daphne'] for c in cost['Hp']]):.2f}, "
            f"PostgreSQL {med([c['postgres'] for c in cost['Hp']]):.2f}), Hp/F "
            f"{ratio(hp_cpu, cpu_r.b):.2f}x, Hf/Hp {ratio(cpu_r.p, hp_cpu):.2f}x"
        )
    return [lat, thr, cpu_r]
