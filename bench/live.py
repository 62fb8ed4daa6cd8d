"""Scenarios with a live path: S4 ask -> reviewer socket, S5 approve -> agent, S6 worker drain.

Latency is measured one in flight (no coordinated omission): a sample starts only once the
previous one has fully finished. Every hop measured here is a push (channel layer, Redis
pub/sub, Celery over Redis); the only loop in this file that polls is bench orchestration
outside the timed window (S5: finding the approval id to decide).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from bench.run import (
    PY,
    QUEUE,
    REDIS_URL,
    REVIEWER,
    ROOT,
    Result,
    Server,
    django_script,
    login,
    rss_note,
    stop_all,
)
from bench.seams import Mark, seams_note


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def latency_results(
    name: str, unit_target: tuple[float, float], b: list[list[float]], p: list[list[float]]
) -> list[Result]:
    """Per-pair medians (and p99s) in ms; pooled percentiles in the notes."""
    med = Result(name + ", median latency", "ms", False, f"<= {unit_target[0]}x", unit_target[0])
    p99 = Result(name + ", p99 latency", "ms", False, f"<= {unit_target[1]}x", unit_target[1])
    for bs, ps in zip(b, p, strict=True):
        med.b.append(statistics.median(bs) * 1e3)
        med.p.append(statistics.median(ps) * 1e3)
        p99.b.append(pct(bs, 0.99) * 1e3)
        p99.p.append(pct(ps, 0.99) * 1e3)
    allb = [x for xs in b for x in xs]
    allp = [x for xs in p for x in xs]
    med.notes.append(
        f"pooled over {len(allb)} B / {len(allp)} P samples (one in flight, after warm-up): "
        f"B p50 {pct(allb, 0.5) * 1e3:.2f} p90 {pct(allb, 0.9) * 1e3:.2f} p99 {pct(allb, 0.99) * 1e3:.2f} "
        f"max {max(allb) * 1e3:.1f} ms; P p50 {pct(allp, 0.5) * 1e3:.2f} p90 {pct(allp, 0.9) * 1e3:.2f} "
        f"p99 {pct(allp, 0.99) * 1e3:.2f} max {max(allp) * 1e3:.1f} ms; pooled p99 P/B "
        f"{pct(allp, 0.99) / pct(allb, 0.99):.2f}"
    )
    return [med, p99]


def floor_result(
    label: str,
    unit: str,
    higher_is_better: bool,
    target: float,
    b: list[float],
    f: list[float],
    p: list[float],
) -> Result:
    """F (bench/floor.py: the guarantees alone) against the same baseline as P, per pair.

    Its verdict says whether the target is reachable at all on this stack: a target that
    F / B misses cannot be met without giving up a guarantee."""
    sign = ">=" if higher_is_better else "<="
    res = Result(
        f"{label}f floor of {label}: the guarantees alone (bench/floor.py: two durable "
        "transitions with their audit appends, raw SQL, on the same worker; S5 also the "
        "decision's) vs the same baseline",
        unit,
        higher_is_better,
        f"{sign} {target}x",
        target,
        b=list(b),
        p=list(f),
    )
    above = sorted(x / y if not higher_is_better else y / x for x, y in zip(p, f, strict=True))
    res.notes.append(
        "Harness above its guarantees, P / F per pair "
        f"({'time' if not higher_is_better else 'throughput F / P'}): median "
        f"{statistics.median(above):.2f}x (min {above[0]:.2f}, max {above[-1]:.2f})"
    )
    return res


# The floor's task per side: F the guarantees alone; G with stage 6 as Harness's worker
# makes it (the call's read, its policy context, the guards; the tool's body).
CHECKED = {"F": "bench.tasks.floor_execute", "G": "bench.tasks.floor_execute_checked"}


def checked_note(b: list[float], f: list[float], g: list[float], *, higher_is_better: bool) -> str:
    """G (the floor with the worker's stage 6: bench.tasks.floor_execute_checked) per
    pair, against the baseline and against F."""
    gb = sorted(x / y for x, y in zip(g, b, strict=True))
    gf = sorted(x / y for x, y in zip(g, f, strict=True))
    return (
        "G, the floor with stage 6 as Harness's worker makes it (before the claim the call "
        "read with its session and policy layers, its context, the guards; after it the "
        "tool's body and its content): G/B median "
        f"{statistics.median(gb):.2f}x (min {gb[0]:.2f}, max {gb[-1]:.2f}), G/F median "
        f"{statistics.median(gf):.2f}x ({'higher' if higher_is_better else 'lower'} is better)"
    )


def login_cookie(server: Server) -> str:
    """The bench reviewer's session cookie, as a Cookie header."""
    return "; ".join(f"{k}={v}" for k, v in login(server, *REVIEWER).items())


async def open_sockets(server: Server, cookie: str, n: int) -> list[Any]:
    from websockets.asyncio.client import connect

    sockets = []
    for _ in range(n):
        ws = await connect(
            f"ws://127.0.0.1:{server.port}/ws/approvals/",
            additional_headers={"Cookie": cookie},
            origin=server.url,  # type: ignore[arg-type]
            max_size=None,
            compression=None,
        )
        await asyncio.wait_for(ws.recv(), 30)  # the whole queue, sent on connect
        sockets.append(ws)
    return sockets


async def receive_token(ws: Any, token: str) -> int:
    while True:
        msg = await ws.recv()
        if token in msg:
            return len(msg)


async def new_session(client: Any, title: str) -> str:
    r = await client.post("/api/v1/sessions", json={"title": title})
    r.raise_for_status()
    return str(r.json()["id"])


def write_call(token: str) -> dict[str, Any]:
    return {
        "calls": [
            {
                "id": f"w-{token}",
                "name": "write_file",
                "arguments": {"path": f"bench/{token}.txt", "content": "bench\n"},
            }
        ]
    }


# --- S4 ---------------------------------------------------------------------------------

QUERIES_PER_PUSH = """
import django, json, sys
django.setup()
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from approvals import live
from dispatcher.models import ToolCall
c = Client(headers={"authorization": "Bearer " + sys.argv[1]})
out = []
for i in range(2):
    body = json.dumps({"calls": [{"id": "q%d" % i, "name": "write_file",
                                  "arguments": {"path": "q/%d.txt" % i, "content": "x"}}]})
    with CaptureQueriesContext(connection) as whole:
        r = c.post("/api/v1/sessions/%s/calls" % sys.argv[2], body, content_type="application/json")
    call = ToolCall.objects.get(session_id=sys.argv[2], tool_use_id="q%d" % i)
    with CaptureQueriesContext(connection) as render:
        live.render_change(str(call.pk), "pending_approval")
    out.append((r.status_code, call.status, len(whole.captured_queries), len(render.captured_queries)))
print(json.dumps(out))
"""


def scenario_push(
    env: dict[str, str], creds: dict[str, str], pairs: int, quick: bool
) -> list[Result]:
    import httpx

    n, warm = (12, 3) if quick else (200, 50)
    server = Server("S4", env)
    results: list[Result] = []
    try:
        cookie = login_cookie(server)

        async def run() -> None:
            async with httpx.AsyncClient(
                base_url=server.url,
                headers={"Authorization": f"Bearer {creds['std_token']}"},
                timeout=30,
            ) as client:
                session = await new_session(client, "S4")
                sizes: list[int] = []

                async def sample(side: str, sockets: list[Any]) -> float:
                    token = uuid.uuid4().hex
                    waiters = [asyncio.create_task(receive_token(ws, token)) for ws in sockets]
                    if side == "P":
                        t0 = time.perf_counter()
                        resp = asyncio.create_task(
                            client.post(f"/api/v1/sessions/{session}/calls", json=write_call(token))
                        )
                    else:
                        size = int(statistics.median(sizes)) if sizes else 1000
                        t0 = time.perf_counter()
                        resp = asyncio.create_task(
                            client.post("/api/bench/push", json={"token": token, "size": size})
                        )
                    got = await asyncio.wait_for(asyncio.gather(*waiters), 30)
                    t1 = time.perf_counter()
                    r = await resp
                    if r.status_code != 202:
                        raise RuntimeError(f"S4 {side}: HTTP {r.status_code}: {r.text[:300]}")
                    if side == "P":
                        if r.json()["calls"][0]["status"] != "pending_approval":
                            raise RuntimeError(f"S4 P: not pending: {r.text[:300]}")
                        sizes.append(got[0])
                    return t1 - t0

                # All sockets connect before any call is pending: a connect sends the whole
                # queue in one message, which fails once it exceeds 1 MiB (see the docs).
                # The 1-socket run keeps the first socket and closes the other 49.
                opened = await open_sockets(server, cookie, 50)
                for count in (50, 1):
                    sockets = opened[:count]
                    for _ in range(warm):
                        await sample("P", sockets)
                        await sample("B", sockets)
                    bs: list[list[float]] = []
                    ps: list[list[float]] = []
                    for _ in range(pairs):
                        bs.append([await sample("B", sockets) for _ in range(n)])
                        ps.append([await sample("P", sockets) for _ in range(n)])
                    for ws in opened[1:] if count > 1 else opened:
                        await ws.close()
                    rs = latency_results(
                        f"S4 ask reaches {count} reviewer socket{'s' if count > 1 else ''} "
                        f"(write_file submit, standard mode -> pending_approval -> pushed fragment"
                        f"{', time to the last socket' if count > 1 else ''}) vs one INSERT + raw "
                        f"group_send of the same size ({int(statistics.median(sizes))} B)",
                        # Issue 16's target for one socket is a median of 2.5x; the rest
                        # stay the earlier round's.
                        (1.3 if count > 1 else 2.5, 1.5),
                        bs,
                        ps,
                    )
                    results.extend(rs)

        asyncio.run(run())
        results[0].notes.append(rss_note([server]))
        results[2].notes.append(rss_note([server]))
        results[0].notes.append(push_queries_note(env, creds, server))
        if quick:
            results[0].notes.append(
                f"quick mode: {n} samples per side per pair (not the 1,000 of the protocol)"
            )
            results[2].notes.append(
                f"quick mode: {n} samples per side per pair (not the 1,000 of the protocol)"
            )
    finally:
        server.stop()
    return results


def push_queries_note(env: dict[str, str], creds: dict[str, str], server: Server) -> str:
    import httpx

    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {creds['std_token']}"}
    ) as c:
        session = c.post("/api/v1/sessions", json={"title": "S4 queries"}).json()["id"]
    try:
        out = django_script(env, QUERIES_PER_PUSH, creds["std_token"], session).strip()
        out = out.splitlines()[-1]
        rows = json.loads(out)
        return (
            "SQL queries per push: rendering the pushed fragment (live.render_change) "
            f"{rows[-1][3]} queries, once per transition whatever the number of sockets (the "
            "consumer's queue_push only forwards the HTML: 0 per socket); the whole submit incl. "
            f"on_commit push {rows[-1][2]} queries (HTTP {rows[-1][0]}, {rows[-1][1]})"
        )
    except (subprocess.SubprocessError, IndexError, ValueError) as exc:
        return f"SQL queries per push unavailable: {exc}"


# --- the bench worker -----------------------------------------------------------------------


class Worker:
    """A Celery prefork worker (-c 2) on the bench queue, started and stopped by PID."""

    def __init__(self, env: dict[str, str], wait: bool = True, root: Path = ROOT) -> None:
        """Started; answering pings on return unless `wait=False` (then call `ready()`).
        `root`: the checkout it runs (S14's baseline may be another)."""
        from harness_site.celery import app

        self.app = app
        self.proc = subprocess.Popen(
            [
                PY,
                "-m",
                "celery",
                "-A",
                "harness_site",
                "worker",
                "-P",
                "prefork",
                "-c",
                "2",
                "-Q",
                QUEUE,
                "--without-gossip",
                "--without-mingle",
                "-I",
                "bench.tasks",
                "-l",
                "WARNING",
                "-n",
                f"bench-{os.getpid()}@%h",
            ],
            cwd=root,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        if wait:
            self.ready()

    def ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"celery worker exited: {err[-2000:]}")
            if self.app.control.ping(destination=[self.name], timeout=0.5):
                return
        self.stop()
        raise RuntimeError("celery worker did not answer a ping")

    @property
    def name(self) -> str:
        return f"bench-{os.getpid()}@{os.uname().nodename}"

    def consume(self, on: bool) -> None:
        if on:
            self.app.control.add_consumer(QUEUE, destination=[self.name], reply=True, timeout=5)
        else:
            self.app.control.cancel_consumer(QUEUE, destination=[self.name], reply=True, timeout=5)

    def pids(self) -> list[int]:
        try:
            kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            kids = []
        return [self.proc.pid, *map(int, kids)]

    def rss_note(self) -> str:
        parts = []
        for pid in self.pids():
            try:
                m = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
            except OSError:
                continue
            if m:
                parts.append(f"pid {pid} {int(m.group(1)) / 1024:.0f} MiB")
        return "peak RSS (VmHWM) of the celery worker (main, then pool children): " + ", ".join(
            parts
        )

    def stop(self) -> None:
        stop_all([self])


# --- S5 and S6 ------------------------------------------------------------------------------


def scenario_worker(
    env: dict[str, str], creds: dict[str, str], pairs: int, quick: bool
) -> list[Result]:
    from redis import asyncio as aioredis

    cleanup = __import__("bench.run", fromlist=["cleanup_redis"]).cleanup_redis
    cleanup()
    server, worker = Server("S5/S6", env, wait=False), Worker(env, wait=False)
    # S5's G: the agent's waiting request on the floor's app (bench/api_floor.py), woken
    # by the floor task's publish on its own channel
    floor_channel = f"harness_bench:s5g:{uuid.uuid4().hex}"
    floor_app = Server(
        "S5g",
        {**env, "BENCH_FLOOR_CHECKED": "1", "BENCH_FLOOR_CHANNEL": floor_channel},
        wait=False,
        app="bench.api_floor:application",
    )
    results: list[Result] = []
    try:
        server.ready()
        worker.ready()
        floor_app.ready()
        n, warm = (12, 3) if quick else (200, 50)
        r5 = asyncio.run(
            _approve(server, worker, creds, pairs, n, warm, aioredis, floor_app, floor_channel)
        )
        for r in r5:
            r.notes.append(rss_note([server]))
            r.notes.append(worker.rss_note())
            if quick:
                r.notes.append(
                    f"quick mode: {n} samples per side per pair (not the 1,000 of the protocol)"
                )
        results += r5
        drain = 24 if quick else 150
        r6 = asyncio.run(_drain(server, worker, creds, pairs, drain, aioredis))
        r6[0].notes.append(worker.rss_note())
        results += r6
    finally:
        stop_all([worker, server, floor_app])
    return results


def floor_calls(session: str, n: int, status: str, tool: str = "bench_noop") -> list[str]:
    """`n` calls of `session` in `status`, written directly: the rows F's transitions move
    (outside the timed window), in batches of 20 as S6's P admits its calls. Returns their
    ids."""
    from django.utils import timezone

    from dispatcher.models import Dialect, ToolCall

    batches = [uuid.uuid4() for _ in range(0, n, 20)]
    now = timezone.now()
    rows = ToolCall.objects.bulk_create(
        ToolCall(
            session_id=session,
            tool_use_id=f"f-{uuid.uuid4().hex}",
            name=tool,
            raw_arguments=json.dumps(floor_arguments(tool, i)),
            arguments=floor_arguments(tool, i),
            digest=uuid.uuid4().hex * 2,
            dialect=Dialect.NATIVE,
            batch_id=batches[i // 20],
            batch_index=i % 20,
            status=status,
            decision="allow" if status == "queued" else "ask",
            queued_at=now if status == "queued" else None,
            enqueued_at=now if status == "queued" else None,
        )
        for i in range(n)
    )
    return [str(row.pk) for row in rows]


def floor_arguments(tool: str, i: int) -> dict[str, Any]:
    """A floor call's arguments: S5's P writes a file (write_file), S6's runs bench_noop."""
    if tool == "write_file":
        return {"path": f"bench/g-{i}-{uuid.uuid4().hex}.txt", "content": "bench\n"}
    return {"n": i}


async def _approve(
    server: Server,
    worker: Worker,
    creds: dict[str, str],
    pairs: int,
    n: int,
    warm: int,
    aioredis: Any,
    floor_app: Server,
    floor_channel: str,
) -> list[Result]:
    import httpx
    from django.contrib.auth import get_user_model

    from approvals import services
    from approvals.models import ApprovalRequest

    reviewer = await asyncio.to_thread(get_user_model().objects.get, username=REVIEWER[0])
    redis = aioredis.from_url(REDIS_URL)
    pubsub = redis.pubsub()
    channel = f"harness_bench:s5:{uuid.uuid4().hex}"
    await pubsub.subscribe(channel)
    await pubsub.get_message(timeout=5)  # the subscribe confirmation
    decide_times: list[float] = []
    marks: list[Mark] = []

    def find(session: str, tid: str) -> tuple[int, str] | None:
        return (
            ApprovalRequest.objects.filter(  # type: ignore[misc]
                call__session_id=session, call__tool_use_id=tid
            )
            .values_list("pk", "digest")
            .first()
        )

    def decide(pk: int, digest: str) -> None:
        t = time.perf_counter()
        services.decide(approval_id=pk, user=reviewer, approve=True, digest=digest)
        decide_times.append(time.perf_counter() - t)

    def send_noop() -> None:
        worker.app.send_task("bench.tasks.noop", args=[channel], queue=QUEUE)

    def floor_decide(
        call_id: str, chain: str, task: str = "bench.tasks.floor_execute", to: str = channel
    ) -> None:
        from bench import floor

        floor.transition(call_id, chain, "pending_approval", "queued")
        worker.app.send_task(task, args=[call_id, chain, to], queue=QUEUE)

    floor_rows: list[str] = []

    agent = {"Authorization": f"Bearer {creds['std_token']}"}
    async with (
        httpx.AsyncClient(base_url=server.url, headers=agent, timeout=60) as client,
        httpx.AsyncClient(base_url=floor_app.url, headers=agent, timeout=60) as floor_client,
    ):
        session = await new_session(client, "S5")

        async def sample(side: str) -> float:
            if side == "G":  # the agent's request waits on the floor's app, as P's on Harness
                call_id = checked_rows.pop()
                resp = asyncio.create_task(floor_client.get(f"/api/v1/calls/{call_id}?wait=30"))
                await asyncio.sleep(0.01)  # (as P's: the request is now in its wait)
                t0 = time.perf_counter()
                await asyncio.to_thread(floor_decide, call_id, session, CHECKED["G"], floor_channel)
                r = await resp
                t1 = time.perf_counter()
                if r.status_code != 200 or r.json()["status"] != "completed":
                    raise RuntimeError(f"S5 G: HTTP {r.status_code}: {r.text[:300]}")
                return t1 - t0
            if side in ("B", "F"):
                t0 = time.perf_counter()
                if side == "B":
                    await asyncio.to_thread(send_noop)
                else:
                    await asyncio.to_thread(floor_decide, floor_rows.pop(), session)
                while (
                    await pubsub.get_message(ignore_subscribe_messages=True, timeout=30)
                ) is None:
                    pass
                return time.perf_counter() - t0
            token = uuid.uuid4().hex
            resp = asyncio.create_task(
                client.post(f"/api/v1/sessions/{session}/calls?wait=30", json=write_call(token))
            )
            found = None
            while found is None:  # orchestration, outside the timed window
                await asyncio.sleep(0.003)
                found = await asyncio.to_thread(find, session, f"w-{token}")
            await asyncio.sleep(0.01)  # the request is now in its pub/sub wait
            wall, t0 = time.time(), time.perf_counter()
            await asyncio.to_thread(decide, *found)
            r = await resp
            t1 = time.perf_counter()
            marks.append((f"w-{token}", wall, wall + t1 - t0))
            call = r.json()["calls"][0]
            if r.status_code != 200 or call["status"] != "completed":
                raise RuntimeError(f"S5 P: HTTP {r.status_code}: {r.text[:300]}")
            return t1 - t0

        floor_rows += await asyncio.to_thread(
            floor_calls, session, warm + pairs * n, "pending_approval"
        )
        checked_rows = await asyncio.to_thread(
            floor_calls, session, warm + pairs * n, "pending_approval", "write_file"
        )
        for _ in range(warm):
            await sample("B")
            await sample("P")
            await sample("F")
            await sample("G")
        decide_times.clear()
        marks.clear()
        bs: list[list[float]] = []
        ps: list[list[float]] = []
        fs: list[list[float]] = []
        gs: list[list[float]] = []
        for _ in range(pairs):
            bs.append([await sample("B") for _ in range(n)])
            ps.append([await sample("P") for _ in range(n)])
            fs.append([await sample("F") for _ in range(n)])
            gs.append([await sample("G") for _ in range(n)])
    await pubsub.aclose()
    await redis.aclose()
    rs = latency_results(
        "S5 approve reaches the agent's waiting request (POST ...?wait=30, approvals.services.decide "
        "in the bench process -> Celery write_file -> wake-up) vs raw Celery no-op round trip "
        "(send_task, result by Redis pub/sub)",
        (6.0, 4.0),  # issue 16: median 6x (from 3x); p99 the earlier round's
        bs,
        ps,
    )
    rs.append(
        floor_result(
            "S5",
            "ms",
            False,
            6.0,
            [statistics.median(x) * 1e3 for x in bs],
            [statistics.median(x) * 1e3 for x in fs],
            [statistics.median(x) * 1e3 for x in ps],
        )
    )
    rs[-1].notes.append(
        checked_note(
            [statistics.median(x) * 1e3 for x in bs],
            [statistics.median(x) * 1e3 for x in fs],
            [statistics.median(x) * 1e3 for x in gs],
            higher_is_better=False,
        )
    )
    rs[-1].notes.append(
        "S5's G runs P's tool (write_file) and ends, as P does, at the agent's request: "
        "GET /api/v1/calls/<id>?wait=30 waiting on the floor's app (bench/api_floor.py, its "
        "own daphne), woken by the floor task's publish, the call read again and answered"
    )
    rs[0].notes.append(
        await asyncio.to_thread(
            seams_note,
            "S5",
            marks,
            ["call.approved", "call.started", "call.completed"],
            "the reviewer's decision",
        )
    )
    rs[0].notes.append(
        f"of P: services.decide() itself (lock, transition, audit, commit, on_commit enqueue and "
        f"queue push) median {statistics.median(decide_times) * 1e3:.2f} ms, "
        f"p99 {pct(decide_times, 0.99) * 1e3:.2f} ms"
    )
    return rs


def drain_cpu(worker: Worker) -> dict[str, float]:
    """Seconds of CPU so far of the worker (main and children), PostgreSQL and Redis."""
    from bench.agent_path import _cpu_of, _postgres_pids

    redis_pids = [
        int(e.name)
        for e in Path("/proc").iterdir()
        if e.name.isdigit() and _comm(e) == "redis-server"
    ]
    return {
        "worker": sum(map(_cpu_of, worker.pids())),
        "postgres": sum(map(_cpu_of, _postgres_pids())),
        "redis": sum(map(_cpu_of, redis_pids)),
    }


def _comm(entry: Path) -> str:
    try:
        return (entry / "comm").read_text().strip()
    except OSError:
        return ""


async def _drain(
    server: Server, worker: Worker, creds: dict[str, str], pairs: int, n: int, aioredis: Any
) -> list[Result]:
    import httpx

    redis = aioredis.from_url(REDIS_URL)
    res = Result(
        f"S6 worker execution throughput: {n} queued no-op tool calls (bench_noop, trusted mode) "
        f"drained by prefork -c 2 vs {n} raw Celery no-op tasks, same worker",
        "calls/s",
        True,
        ">= 0.3x",  # issue 16's target (from 0.5x)
        0.3,
    )
    batch = 20
    cpu: dict[str, dict[str, list[float]]] = {}

    async with (
        httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {creds['token']}"}, timeout=60
        ) as client,
        httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {creds['token2']}"}, timeout=60
        ) as client2,
    ):
        session = await new_session(client, "S6")
        session2 = await new_session(client2, "S6")

        async def side(label: str) -> float:
            await asyncio.to_thread(worker.consume, False)
            pubsub = redis.pubsub()
            if label in ("P", "P1"):
                # P: the calls of two people (agents of two owners), batch by batch in turn;
                # P1: one person's alone, which the running cap runs one at a time here
                # (HARNESS_MAX_RUNNING_PER_OWNER=auto: the worker's 2 processes minus one)
                people = [(client, session), (client2, session2)][: 2 if label == "P" else 1]
                # Every change of the sessions' calls, "<call id> <status>" (dispatcher.wakeups)
                for _, sid in people:
                    await pubsub.subscribe(f"harness_bench:wake:session:{sid}")
                for start in range(0, n, batch):
                    agent_client, sid = people[start // batch % len(people)]
                    body = {
                        "calls": [
                            {
                                "id": f"n-{uuid.uuid4().hex}",
                                "name": "bench_noop",
                                "arguments": {"n": i},
                            }
                            for i in range(start, min(n, start + batch))
                        ]
                    }
                    r = await agent_client.post(f"/api/v1/sessions/{sid}/calls", json=body)
                    if r.status_code != 202:
                        raise RuntimeError(f"S6 {label}: HTTP {r.status_code}: {r.text[:300]}")
            elif label in ("F", "G"):
                key = f"harness_bench:s6f:{uuid.uuid4().hex}"
                await pubsub.subscribe(key)
                ids = await asyncio.to_thread(floor_calls, session, n, "queued")

                def send_floor() -> None:
                    for call_id in ids:
                        worker.app.send_task(
                            CHECKED[label], args=[call_id, session, key], queue=QUEUE
                        )

                await asyncio.to_thread(send_floor)
            else:
                key = f"harness_bench:s6:{uuid.uuid4().hex}"
                await pubsub.subscribe(key)

                def send() -> None:
                    for _ in range(n):
                        worker.app.send_task("bench.tasks.noop_count", args=[key, n], queue=QUEUE)

                await asyncio.to_thread(send)
            queued = await redis.llen(QUEUE)
            cpu0 = drain_cpu(worker)
            t0 = time.perf_counter()
            await asyncio.to_thread(worker.consume, True)
            done = 0
            target = 1 if label == "B" else n
            while done < target:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=60)
                if msg is None:
                    if time.perf_counter() - t0 > 120:
                        raise RuntimeError(f"S6 {label}: drained {done} of {target}")
                    continue
                data = msg["data"]  # P: "<call id> completed"; F: "completed"
                if label == "B" or data.split(b" ")[-1] == b"completed":
                    done += 1
            elapsed = time.perf_counter() - t0
            cpu1 = drain_cpu(worker)
            for k in cpu0:
                cpu.setdefault(label, {}).setdefault(k, []).append((cpu1[k] - cpu0[k]) / n * 1e3)
            await pubsub.aclose()
            if queued < n - 4:  # prefetch may hold a few before the consumer was cancelled
                res.notes.append(f"WARNING: {label} found only {queued} of {n} messages queued")
            return n / elapsed

        await side("B")  # warm-up
        await side("P")
        await side("P1")
        await side("F")
        await side("G")
        fs: list[float] = []
        gs: list[float] = []
        ones: list[float] = []
        for _ in range(pairs):
            res.b.append(await side("B"))
            res.p.append(await side("P"))
            ones.append(await side("P1"))
            fs.append(await side("F"))
            gs.append(await side("G"))
    await redis.aclose()
    res.notes.append(
        "each side: consumer cancelled, N messages queued (P: admitted through the API in batches "
        f"of {batch}, two people's agents in turn), then add_consumer and time until the N-th "
        "completion is published"
    )
    one = [p / b for b, p in zip(res.b, ones, strict=True)]
    res.notes.append(
        f"one person's calls alone (P1): P1/B median {statistics.median(one):.3f} (min "
        f"{min(one):.3f}, max {max(one):.3f}), {statistics.median(ones):,.0f} calls/s: the "
        "running cap per person (HARNESS_MAX_RUNNING_PER_OWNER=auto, the worker's processes "
        "minus one: 1 here) runs one person's calls one at a time, by design"
    )
    res.notes.append(
        "CPU per call during the drain (ms, median of the pairs; the worker's main process and "
        "pool children, every PostgreSQL process, the Redis server): "
        + "; ".join(
            f"{label} "
            + ", ".join(f"{k} {statistics.median(v[1:]):.2f}" for k, v in cpu[label].items())
            + f", all {statistics.median([sum(x) for x in zip(*cpu[label].values(), strict=True)][1:]):.2f}"
            for label in ("B", "P", "P1", "F", "G")
        )
    )
    floor = floor_result("S6", "calls/s", True, 0.3, res.b, fs, res.p)
    floor.notes.append(checked_note(res.b, fs, gs, higher_is_better=True))
    return [res, floor]
