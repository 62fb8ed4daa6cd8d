"""B1: reviewers race on every ask (real daphne, CSRF POSTs from distinct signed-in
reviewers). D1: schemathesis against the agent API's OpenAPI document. D2: raw malformed
requests: no 5xx, bounded latency and server memory."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from tests.battery import figures
from tests.battery.conftest import reviewer_client, seed_for, size
from tests.battery.live import native, start_session, started_counts, wait_terminal
from tests.battery.procs import Stack
from tests.battery.tools import EXTRA_TOOLS
from tests.support.factories import make_agent

ASKS = size(6, 200)


@pytest.mark.timeout(1800)
def test_b1_each_ask_gets_one_decision_and_runs_at_most_once(stack: Stack) -> None:
    rng = random.Random(seed_for("B1"))
    stack.env["HARNESS_EXTRA_TOOLS"] = EXTRA_TOOLS
    url = stack.daphne()
    stack.worker(2)
    fx = make_agent(mode="standard")
    reviewers = [reviewer_client(url) for _ in range(16)]
    failures: list[str] = []
    for k in (2, 4, 8, 16):
        with stack.agent_client(url, fx.headers) as client:
            sessions = [start_session(client) for _ in range(10)]
            ids = []
            for i in range(ASKS):
                body = native(f"k{k}-{i}", "battery_marker", {"path": f"m/{k}-{i}.txt"})
                response = client.post(
                    f"/api/v1/sessions/{sessions[i % 10]['id']}/calls", json=body
                )
                ids.append(response.json()["calls"][0]["id"])
        approvals = list(ApprovalRequest.objects.filter(call_id__in=ids).select_related("call"))

        def race(approval: ApprovalRequest, k: int = k) -> list[int]:
            contenders = rng.sample(reviewers, k)
            actions = [rng.choice(["approve", "deny"]) for _ in contenders]
            barrier = threading.Barrier(k)

            def attempt(pair: tuple[httpx.Client, str]) -> int:
                client, action = pair
                barrier.wait(30)
                response = client.post(
                    f"/approvals/{approval.pk}/decide",
                    data={"action": action, "digest": approval.call.digest},
                )
                return response.status_code

            with ThreadPoolExecutor(k) as pool:
                return list(pool.map(attempt, zip(contenders, actions, strict=True)))

        with ThreadPoolExecutor(max(1, 32 // k)) as pool:
            answers = list(pool.map(race, approvals))
        left = wait_terminal(ids, 60)
        subjects = [f"call:{i}" for i in ids]
        decisions = AuditEvent.objects.filter(
            subject__in=subjects, kind__in=["call.approved", "call.denied"]
        )
        per_call: dict[str, int] = {}
        for subject in decisions.values_list("subject", flat=True):
            per_call[subject] = per_call.get(subject, 0) + 1
        wins = [a.count(200) for a in answers]
        others = sorted({s for a in answers for s in a if s not in (200, 409)})
        approved = set(
            map(
                str,
                ApprovalRequest.objects.filter(call_id__in=ids, decision="approved").values_list(
                    "call_id", flat=True
                ),
            )
        )
        starts = started_counts(ids)
        bad_exec = [i for i in ids if starts[i] != (1 if i in approved else 0)]
        ok = (
            all(w == 1 for w in wins)
            and all(per_call.get(s) == 1 for s in subjects)
            and not others
            and not bad_exec
            and not left
        )
        figures.record(
            "B1",
            f"k={k}: calls with exactly one decision (200 answers, decided events)",
            f"{sum(w == 1 for w in wins)}/{len(ids)}, {sum(per_call.get(s) == 1 for s in subjects)}/{len(ids)}",
            "all, all",
            all(w == 1 for w in wins) and all(per_call.get(s) == 1 for s in subjects),
            other_statuses=others,
        )
        figures.record(
            "B1",
            f"k={k}: executions per approval (approved {len(approved)})",
            f"{sum(starts[i] for i in approved)}/{len(approved)}; unapproved runs {sum(starts[i] for i in ids if i not in approved)}",
            "1 each; 0",
            not bad_exec and not left,
        )
        if not ok:
            failures.append(f"k={k}")
    for reviewer in reviewers:
        reviewer.close()
    assert not failures, failures


# --- D1 ------------------------------------------------------------------------------------


@pytest.mark.timeout(2400)
def test_d1_schemathesis_finds_no_server_error_or_schema_violation(
    stack: Stack, tmp_path: Path
) -> None:
    seed = seed_for("D1")
    url = stack.daphne()
    fx = make_agent(mode="trusted")
    report = tmp_path / "events.ndjson"
    # schemathesis drops repeated inputs, and how many depends on the seed: 500 per
    # operation gave 7,887 requests and 650 gave 9,995 (2026-12-01); 800 leaves a margin.
    examples = size(40, 800)
    argv = [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/api/v1/openapi.json"]
    argv += ["-H", f"Authorization: Bearer {fx.token}", "--checks", "all", "-n", str(examples)]
    argv += ["--seed", str(seed), "--report", "ndjson", "--report-ndjson-path", str(report)]
    argv += [
        "--continue-on-failure",
        "--request-timeout",
        "30",
        "--no-color",
        "--phases",
        "examples,coverage,fuzzing,stateful",
    ]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=2300, check=False, cwd=tmp_path
    )
    output = done.stdout + done.stderr
    requests, failures = _schemathesis_counts(report)
    (tmp_path / "schemathesis.txt").write_text(output)
    server_errors = [f for f in failures if "server error" in f.lower() or "5xx" in f.lower()]
    figures.record(
        "D1",
        "requests generated",
        requests,
        ">= 10000" if examples > 100 else ">= 100 (ci)",
        requests >= (10000 if examples > 100 else 100),
    )
    figures.record("D1", "5xx responses", len(server_errors), "0", not server_errors)
    figures.record(
        "D1",
        "check failures (schema, status code, negative data ...)",
        len(failures),
        "0",
        not failures,
        failures=sorted(set(failures))[:30],
    )
    print(output[-6000:])
    assert requests > 0, output[-3000:]
    assert not failures, sorted(set(failures))[:30]


def _schemathesis_counts(path: Path) -> tuple[int, list[str]]:
    """Requests sent and failed checks, from schemathesis' NDJSON event stream."""
    requests, failures = 0, []
    if not path.exists():
        return 0, ["no report written"]
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        text = json.dumps(event)
        requests += text.count('"request": {')
        for name, body in event.items():
            if name.endswith("ScenarioFinished") or name == "ScenarioFinished":
                for check in _walk(body, "checks"):
                    for item in check if isinstance(check, list) else []:
                        if isinstance(item, dict) and item.get("status") == "FAILURE":
                            failures.append(
                                f"{item.get('name')}: {str(item.get('failure_info') or '')[:200]}"
                            )
    return requests, failures


def _walk(value: Any, key: str) -> list[Any]:
    found = []
    if isinstance(value, dict):
        for k, v in value.items():
            if k == key:
                found.append(v)
            found += _walk(v, key)
    elif isinstance(value, list):
        for v in value:
            found += _walk(v, key)
    return found


# --- D2 ------------------------------------------------------------------------------------


def malformed(rng: random.Random, i: int) -> tuple[bytes, dict[str, str]]:
    kind = i % 12
    json_type = {"Content-Type": "application/json"}
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))), json_type
    if kind == 1:
        return b'{"calls": [{"id": "\xff\xfe", "name": "read_file", "arguments": {}}]}', json_type
    if kind == 2:
        depth = rng.choice([100, 1000, 5000, 100000])
        return b"[" * depth + b"]" * depth, json_type
    if kind == 3:
        depth = rng.choice([50, 500, 3000])
        return (b'{"calls": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"), json_type
    if kind == 4:
        return (
            b'{"calls": [], "calls": [{"id": "a", "id": "b", "name": "read_file", "arguments": {"path": "x", "path": "/etc/passwd"}}]}',
            json_type,
        )
    if kind == 5:
        return rng.choice(
            [
                b'{"calls": [{"id": "n", "name": "read_file", "arguments": {"x": NaN}}]}',
                b"[Infinity]",
                b'{"a": -Infinity}',
            ]
        ), json_type
    if kind == 6:
        if i % 120 == 6:  # every tenth of these: 10 MB
            return (
                b'{"calls": [{"id": "big", "name": "write_file", "arguments": {"path": "x", "content": "'
                + b"A" * 10_000_000
                + b'"}}]}',
                json_type,
            )
        return (
            b'{"calls": [' + b'{"id": "x", "name": "read_file", "arguments": {}},' * 2000 + b"{}]}",
            json_type,
        )
    if kind == 7:
        ctype = rng.choice(
            [
                "text/plain",
                "multipart/form-data; boundary=x",
                "application/x-www-form-urlencoded",
                "application/xml",
                "",
                "application/json; charset=latin-1",
            ]
        )
        return b'{"calls": [{"id": "c", "name": "read_file", "arguments": {"path": "a"}}]}', {
            "Content-Type": ctype
        }
    if kind == 8:
        return rng.choice(
            [
                b"",
                b" ",
                b"null",
                b"1",
                b'"x"',
                b"[]",
                b"{",
                b'{"calls": 1}',
                b'{"calls": [1]}',
                b'{"calls": [{"id": 1}]}',
            ]
        ), json_type
    if kind == 9:
        return (
            b'{"calls": [{"id": "'
            + "\u202e\u200b\x00".encode()
            + b'", "name": "\\u0000", "arguments": {"a": "\\ud800"}}]}',
            json_type,
        )
    if kind == 10:
        return (
            b'{"role": "assistant", "tool_calls": [{"id": "o", "type": "function", "function": {"name": "read_file", "arguments": "{not json"}}]}',
            json_type,
        )
    return b'{"calls": [{"id": "h", "name": "read_file", "arguments": {"path": "a"}}]}', {
        **json_type,
        "X-Huge": "x" * rng.choice([1000, 8000, 60000]),
    }


@pytest.mark.timeout(2400)
def test_d2_malformed_requests_get_no_5xx_and_bounded_latency_and_memory(stack: Stack) -> None:
    rng = random.Random(seed_for("D2"))
    url = stack.daphne()
    daphne = stack.daphnes[0][0]
    fx = make_agent(mode="standard")
    count = size(240, 10000)
    statuses: dict[str, int] = {}
    latencies: list[float] = []
    errors: list[str] = []
    oversized: list[int] = []
    dropped_headers: list[str] = []
    with stack.agent_client(url, fx.headers, timeout=60) as client:
        sid = start_session(client)["id"]
        for _ in range(20):  # warm up before the first memory reading
            client.post(
                f"/api/v1/sessions/{sid}/calls", json=native("warm", "read_file", {"path": "a"})
            )
        rss_before = daphne.rss()
        for i in range(count):
            body, headers = malformed(rng, i)
            target = f"/api/v1/sessions/{sid}/calls" if i % 5 else "/api/v1/sessions"
            started = time.monotonic()
            try:
                response = client.post(target, content=body, headers=headers)
                status = str(response.status_code)
                if response.status_code >= 500:
                    errors.append(f"{status} {body[:80]!r} {response.text[:200]}")
                if len(body) > 1_000_000:
                    oversized.append(response.status_code)
            except httpx.HTTPError as error:
                status = type(error).__name__
                if len(headers.get("X-Huge", "")) > 16_000:
                    # daphne's HTTP parser (Twisted) closes the connection on a header line
                    # over 16 KiB without an answer: counted apart, not a 5xx of Harness.
                    dropped_headers.append(status)
                else:
                    errors.append(f"{status} {body[:80]!r}")
            latencies.append(time.monotonic() - started)
            statuses[status] = statuses.get(status, 0) + 1
        rss_after = daphne.rss()
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    growth_mb = (rss_after - rss_before) / 2**20
    figures.record(
        "D2",
        f"5xx or dropped connections of {count} malformed requests",
        len(errors),
        "0",
        not errors,
        statuses=statuses,
        errors=errors[:10],
    )
    figures.record("D2", "p99 latency (s)", round(p99, 3), "< 1", p99 < 1)
    figures.record(
        "D2",
        "daphne RSS growth (MB)",
        round(growth_mb, 1),
        "< 200",
        growth_mb < 200,
        before_mb=round(rss_before / 2**20, 1),
    )
    figures.record(
        "D2",
        "oversized bodies answered 413",
        f"{oversized.count(413)}/{len(oversized)}",
        "all",
        all(s == 413 for s in oversized),
    )
    assert not errors, errors[:10]
    assert p99 < 1 and growth_mb < 200
    assert all(s == 413 for s in oversized)
