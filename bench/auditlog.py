"""S7 session timeline page and S8 audit export: data loaded by COPY FROM, valid hash chains.

Events are built in Python with the product's own `canonical_event`/`chain_hash` (so the
chains verify and the export is realistic) and loaded with PostgreSQL `COPY FROM STDIN`
(psycopg `cursor.copy`): INSERT only, the append-only triggers allow it. Each session also
gets its `AuditChain` head row. A session is `session.started` followed by calls of four
events each (received, allowed -> queued, started, completed).
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.run import PY, ROOT, Result, Server, django_script, fmt, login

FIELDS = ("chain", "session_id", "seq", "kind", "actor", "subject", "payload", "created_at")
COPY_EVENTS = (
    "COPY audit_auditevent (chain, session_id, seq, kind, actor, subject, payload, created_at, "
    "prev_hash, hash) FROM STDIN"
)
CHAIN_COLUMNS = (
    "chain, session_id, agent, owner, title, mode, first_at, last_at, last_seq, last_hash, "
    "last_event_id, tools, calls, allowed, asked, approved, denied, rejected, cancelled, expired, "
    "completed, errors, timed_out, outcome_unknown, head_signature"
)


def session_events(session: str, n_events: int, start: datetime) -> list[tuple[Any, ...]]:
    """(kind, actor, subject, payload, created_at) for one session of n_events events."""
    agent = "agent:bench-agent"
    out: list[tuple[Any, ...]] = [
        (
            "session.started",
            agent,
            session,
            {"agent": "bench-agent", "owner": "bench", "title": "bench session", "mode": "trusted"},
            start,
        )
    ]
    i = 0
    while len(out) < n_events:
        call_id = f"call-{i:06d}"
        args = json.dumps({"path": f"src/module_{i % 97}/file_{i}.py"})
        at = start + timedelta(milliseconds=10 * len(out))
        base = {"call_id": call_id, "tool": "read_file"}
        steps = [
            (
                "call.received",
                agent,
                {
                    **base,
                    "tool_use_id": f"toolu_{i:08d}",
                    "arguments": args,
                    "digest": f"{i:064x}",
                    "dialect": "anthropic",
                    "batch_id": f"batch-{i // 2}",
                    "batch_index": i % 2,
                },
            ),
            (
                "call.allowed",
                "harness",
                {
                    **base,
                    "from": "received",
                    "to": "queued",
                    "action": "allow",
                    "by": "rule",
                    "rule": "read-only tools",
                    "stage": "policy",
                },
            ),
            ("call.started", "worker", {**base, "from": "queued", "to": "running"}),
            (
                "call.completed",
                "worker",
                {
                    **base,
                    "from": "running",
                    "to": "completed",
                    "is_error": False,
                    "seconds": 0.004,
                    "content": f"def f_{i}():\n    return {i}  # file contents, a few lines\n" * 3,
                },
            ),
        ]
        for k, (kind, actor, payload) in enumerate(steps):
            if len(out) >= n_events:
                break
            out.append((kind, actor, call_id, payload, at + timedelta(milliseconds=2 * k)))
        i += 1
    return out


def load_sessions(conninfo: str, sizes: list[int], start: datetime | None = None) -> list[str]:
    """Load one session per entry of `sizes` (events each); returns the session ids."""
    import psycopg

    from audit.services import GENESIS_HASH, canonical_event, chain_hash
    from audit.signing import sign_head

    start = start or datetime(2026, 1, 1, tzinfo=UTC)
    ids: list[str] = []
    heads: list[tuple[Any, ...]] = []
    with psycopg.connect(conninfo) as conn:
        with conn.cursor() as cur, cur.copy(COPY_EVENTS) as copy:
            for n, size in enumerate(sizes):
                session = str(uuid.uuid4())
                ids.append(session)
                prev = GENESIS_HASH
                t0 = start + timedelta(minutes=n)
                events = session_events(session, size, t0)
                for seq, (kind, actor, subject, payload, at) in enumerate(events, 1):
                    created = at.isoformat()
                    h = chain_hash(
                        prev,
                        canonical_event(
                            chain=session,
                            seq=seq,
                            kind=kind,
                            actor=actor,
                            subject=subject,
                            payload=payload,
                            created_at=created,
                        ),
                    )
                    copy.write_row(
                        (session, session, seq, kind, actor, subject, json.dumps(payload))
                        + (created, prev, h)
                    )
                    prev = h
                calls = (size - 1 + 3) // 4
                done = (size - 1) // 4
                heads.append(
                    (session, session, "bench-agent", "bench", "bench session", "trusted", t0)
                    + (events[-1][4], size, prev, 0, " read_file ", calls, calls, 0, 0, 0, 0)
                    + (0, 0, done, 0, 0, 0, sign_head(session, size, prev))
                )
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO audit_auditchain ({CHAIN_COLUMNS}) VALUES ({', '.join(['%s'] * 25)})",  # noqa: S608
                heads,
            )
            cur.execute(
                "UPDATE audit_auditchain c SET last_event_id = e.id FROM audit_auditevent e "
                "WHERE e.chain = c.chain AND e.seq = c.last_seq AND c.chain = ANY(%s)",
                (ids,),
            )
        conn.commit()
        conn.execute("ANALYZE audit_auditevent")
    return ids


# --- S7 timeline page ------------------------------------------------------------------------


TIMELINE_QUERIES = """
import django, sys
django.setup()
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
c = Client()
c.force_login(get_user_model().objects.get(username="bench-auditor"))
out = []
for sid in sys.argv[1:]:
    c.get("/audit/sessions/%s/" % sid)
    with CaptureQueriesContext(connection) as q:
        r = c.get("/audit/sessions/%s/" % sid)
    out += [r.status_code, len(q.captured_queries)]
print(*out)
"""


def scenario_timeline(env: dict[str, str], pairs: int, quick: bool) -> list[Result]:
    import httpx

    small, big = load_sessions(env["DATABASE_URL"], [100, 10_000])
    server = Server("S7", env)
    try:
        cookies = login(server, "bench-auditor", "bench-reviewer-password")
        res = Result(
            "S7 session timeline page: GET /audit/sessions/<id>/ of a 10,000-event session (P) vs "
            "the same page of a 100-event session (B), one request in flight, median latency",
            "ms",
            False,
            "<= 1.2x",
            1.2,
        )
        per_pair = 2 if quick else 4
        sizes: dict[str, int] = {}
        with httpx.Client(base_url=server.url, cookies=cookies, timeout=120) as c:

            def get(sid: str, label: str) -> float:
                t = time.perf_counter()
                r = c.get(f"/audit/sessions/{sid}/")
                elapsed = (time.perf_counter() - t) * 1e3
                if r.status_code != 200:
                    raise RuntimeError(f"S7 {label} answered {r.status_code}")
                sizes[label] = len(r.content)
                return elapsed

            for sid, label in ((small, "B"), (big, "P")):  # warm-up
                for _ in range(2):
                    get(sid, label)
            for _ in range(pairs):
                for sid, label, store in ((small, "B", res.b), (big, "P", res.p)):
                    store.append(statistics.median(get(sid, label) for _ in range(per_pair)))
        res.notes.append(
            f"{per_pair} requests per side per pair (median of each); page size B "
            f"{sizes['B']:,} bytes, P {sizes['P']:,} bytes; S7 daphne peak RSS (VmHWM) "
            f"{server.vm('VmHWM') / 1024:.0f} MiB"
        )
        try:
            out = django_script(env, TIMELINE_QUERIES, small, big, timeout=120).split()
            res.notes.append(
                f"SQL queries per page (CaptureQueriesContext, 2nd request): B (100 events) "
                f"{out[1]} (HTTP {out[0]}), P (10,000 events) {out[3]} (HTTP {out[2]}): "
                f"{'constant' if out[1] == out[3] else 'NOT constant'}"
            )
        except (subprocess.SubprocessError, IndexError) as exc:
            res.notes.append(f"SQL query count unavailable: {exc}")
        return [res]
    finally:
        server.stop()


# --- S8 export -------------------------------------------------------------------------------

COPY_SQL = {
    "csv": "COPY (SELECT id, chain, session_id, seq, kind, actor, subject, payload, created_at, prev_hash, hash "
    "FROM audit_auditevent ORDER BY chain, seq) TO STDOUT (FORMAT csv, HEADER)",
    "jsonl": "COPY (SELECT row_to_json(t) FROM (SELECT id, chain, session_id, seq, kind, actor, subject, payload, created_at, prev_hash, hash "
    "FROM audit_auditevent ORDER BY chain, seq) t) TO STDOUT",
}
COPY_SCRIPT = """
import sys, psycopg
n = 0
with psycopg.connect(sys.argv[1]) as conn, conn.cursor() as cur:
    with cur.copy(sys.argv[2]) as copy:
        for block in copy:
            n += len(block)
print(n)
"""


def run_measured(cmd: list[str], env: dict[str, str]) -> tuple[float, int, bytes]:
    """Wall seconds, peak RSS in KiB and stdout of one process. The peak is its VmHWM in
    /proc, read every 20 ms until it exits (VmHWM only grows; not ru_maxrss, which on Linux
    also counts the parent's RSS copied by the fork before exec)."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = 0
    status = Path(f"/proc/{proc.pid}/status")
    while proc.poll() is None:
        try:
            m = re.search(r"VmHWM:\s+(\d+) kB", status.read_text())
            peak = max(peak, int(m.group(1)) if m else 0)
        except OSError:
            pass
        time.sleep(0.02)
    elapsed = time.perf_counter() - t
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} exited {proc.returncode}: {err.decode()[-1500:]}")
    return elapsed, peak, out


def export_once(env: dict[str, str], form: str, side: str) -> tuple[float, int, int]:
    """(seconds, peak RSS KiB, bytes) of one full export of the log."""
    if side == "B":
        t, rss, out = run_measured(
            [PY, "-c", COPY_SCRIPT, env["DATABASE_URL"], COPY_SQL[form]], env
        )
        return t, rss, int(out.split()[-1])
    path = ROOT / "var" / "bench" / f"export.{form}"
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [PY, "manage.py", "export_audit", "--format", form, "--output", str(path)]
    t, rss, _ = run_measured([*cmd, "--no-progress"], env)
    size = path.stat().st_size
    path.unlink()
    return t, rss, size


HTTP_ROWS = 100_000  # the download path is measured at this size (about 10 s in all)


def download_once(client: Any, form: str) -> tuple[float, int, int]:
    """(seconds, rows, bytes) of one streamed download of every session's events."""
    t = time.perf_counter()
    size = lines = 0
    with client.stream("GET", "/audit/export/", params={"format": form}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"S8 download answered {r.status_code}")
        for block in r.iter_raw():
            size += len(block)
            lines += block.count(b"\n")
    return time.perf_counter() - t, lines - (form == "csv"), size


def scenario_download(env: dict[str, str], rows: int, pairs: int) -> list[Result]:
    """S8 through HTTP: an auditor downloads `GET /audit/export/?format=...` (every session,
    the download view streaming `audit.export.async_chunks` under daphne) against the COPY
    of the whole table. P counts the rows it received (the global chain is not a session)."""
    import httpx

    server = Server("S8", env)
    results: list[Result] = []
    try:
        cookies = login(server, "bench-auditor", "bench-reviewer-password")
        with httpx.Client(base_url=server.url, cookies=cookies, timeout=300) as client:
            for form, goal in (("csv", 0.5), ("jsonl", 0.3)):
                res = Result(
                    f"S8 download of {rows:,} audit rows as {form.upper()} over HTTP: GET "
                    f"/audit/export/?format={form} from daphne (P) vs COPY (SELECT ...) TO STDOUT "
                    "(B), throughput",
                    "rows/s",
                    True,
                    f">= {goal}x",
                    goal,
                )
                sizes = {"B": 0, "P": 0}
                got = 0
                for _ in range(pairs):
                    secs, _, sizes["B"] = export_once(env, form, "B")
                    res.b.append(rows / secs)
                    secs, got, sizes["P"] = download_once(client, form)
                    res.p.append(got / secs)
                res.notes.append(
                    f"{pairs} pairs; P received {got:,} rows, {sizes['P'] / 1e6:.0f} MB (B "
                    f"{sizes['B'] / 1e6:.0f} MB); P is the wall time of the request (sent to "
                    "last byte), read by httpx in the runner; B a psycopg subprocess as above"
                )
                results.append(res)
        results[-1].notes.append(f"S8 daphne peak RSS (VmHWM) {server.vm('VmHWM') / 1024:.0f} MiB")
    finally:
        server.stop()
    return results


def scenario_export(env: dict[str, str], pairs: int, quick: bool, full_size: bool) -> list[Result]:
    """full_size (`--only export`, not quick): 1,000,000 rows, one pair per format, memory
    against 100,000. Otherwise (inside the whole suite, or quick): 100,000 rows against
    10,000, so that `make bench` stays within 10 minutes; labelled in the output."""
    import psycopg

    conninfo = env["DATABASE_URL"]
    per_session = 1000
    big_rows = 1_000_000 if full_size and not quick else 100_000
    small_rows = big_rows // 10
    if big_rows >= 1_000_000 or not full_size:
        pairs = 1
    results: list[Result] = []
    rss: dict[tuple[int, str], int] = {}

    def count() -> int:
        with psycopg.connect(conninfo) as conn:
            return int(conn.execute("SELECT count(*) FROM audit_auditevent").fetchone()[0])  # type: ignore[index]

    for target, npairs in ((small_rows, 1), (big_rows, pairs)):
        t = time.perf_counter()
        missing = max(0, target - count())
        load_sessions(
            conninfo,
            [per_session] * -(-missing // per_session),
            datetime(2026, 2, 1, tzinfo=UTC) + timedelta(days=target // 1000),
        )
        rows = count()
        load = time.perf_counter() - t
        for form, goal in (("csv", 0.5), ("jsonl", 0.3)):
            res = Result(
                f"S8 export of {rows:,} audit rows as {form.upper()}: manage.py export_audit "
                f"--format {form} (P) vs COPY (SELECT ...) TO STDOUT (B), throughput",
                "rows/s",
                True,
                f">= {goal}x",
                goal,
            )
            peak = {"B": 0, "P": 0}
            sizes = {"B": 0, "P": 0}
            for _ in range(npairs):
                for side, store in (("B", res.b), ("P", res.p)):
                    secs, kib, size = export_once(env, form, side)
                    store.append(rows / secs)
                    peak[side] = max(peak[side], kib)
                    sizes[side] = size
            rss[(target, form)] = peak["P"]
            if big_rows < 1_000_000:
                res.notes.append(
                    f"REDUCED SIZE: {big_rows:,} rows, not 1,000,000 (time budget of this run); "
                    "`python -m bench.run --only export` measures 1,000,000"
                )
            res.notes.append(
                f"{npairs} pair(s) (wall time of the whole "
                f"process, Python/Django start-up included); output B {sizes['B'] / 1e6:.0f} MB, "
                f"P {sizes['P'] / 1e6:.0f} MB; peak RSS (VmHWM) B {peak['B'] / 1024:.0f} MiB, "
                f"P {peak['P'] / 1024:.0f} MiB; data loaded by COPY FROM in {load:.1f} s"
            )
            if target == big_rows:
                ratio = peak["P"] / max(1, rss[(small_rows, form)])
                res.notes.append(
                    f"P peak RSS at {big_rows:,} rows / at {small_rows:,} rows: "
                    f"{fmt(peak['P'] / 1024)} / {fmt(rss[(small_rows, form)] / 1024)} MiB = "
                    f"{ratio:.3f} (target <= 1.1): {'met' if ratio <= 1.1 else 'MISSED'}"
                )
                results.append(res)
        if target == HTTP_ROWS:
            results += scenario_download(env, rows, 3)
    return results
