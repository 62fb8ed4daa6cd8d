"""Latency of Claude Code's PreToolUse through Harness: an auto-allowed call (a Read the
mode allows) against a bare authenticated request (GET /api/v1/tools), on PostgreSQL.

    python -m bench.hook_latency [--samples 200]

Uses bench.run's own database (BENCH_DB_NAME, dropped and recreated), one daphne on
loopback and sequential requests on one keep-alive connection, the two kinds
interleaved so drift hits all alike; the same auto-allowed read submitted through the
agent API (read_file, native dialect) is measured beside them. Prints the medians and their ratio. Every
PreToolUse is a new call (a fresh tool_use_id) in one Claude Code session: stored, its
received and allowed events appended, decided by the mode, answered allow.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import httpx

from bench.run import Server, bench_env, machine_line, prepare_database

PROJECT = "/home/dev/project"


def pre_tool_use(session_id: str) -> dict[str, object]:
    return {
        "session_id": session_id,
        "transcript_path": f"/home/dev/.claude/projects/x/{session_id}.jsonl",
        "cwd": PROJECT,
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": "Read",
        "tool_input": {"file_path": f"{PROJECT}/src/app.py"},
        "tool_use_id": "toolu_" + uuid.uuid4().hex[:24],
    }


def measure(samples: int) -> tuple[list[float], list[float], list[float]]:
    env = bench_env()
    creds = prepare_database(env)
    server = Server("hooks", env)
    try:
        headers = {"Authorization": f"Bearer {creds['std_token']}"}
        session_id = str(uuid.uuid4())
        hook, bare, api = [], [], []
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
            api_session = client.post("/api/v1/sessions", json={}).json()["id"]
            calls_url = f"/api/v1/sessions/{api_session}/calls"
            for _ in range(20):  # warm-up: connections, caches, the session's first call
                client.get("/api/v1/tools")
                client.post("/api/v1/hooks/claude-code?wait=0", json=pre_tool_use(session_id))
            for _ in range(samples):
                started = time.perf_counter()
                response = client.get("/api/v1/tools")
                bare.append(time.perf_counter() - started)
                assert response.status_code == 200, response.text
                body = pre_tool_use(session_id)
                started = time.perf_counter()
                response = client.post("/api/v1/hooks/claude-code?wait=0", json=body)
                hook.append(time.perf_counter() - started)
                decision = response.json()["hookSpecificOutput"]["permissionDecision"]
                assert decision == "allow", response.text
                call = {"id": uuid.uuid4().hex, "name": "read_file", "arguments": {"path": "a"}}
                started = time.perf_counter()
                response = client.post(calls_url, json={"calls": [call]})
                api.append(time.perf_counter() - started)
                assert response.json()["calls"][0]["decision"] == "allow", response.text
        return hook, bare, api
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    print(machine_line())
    hook, bare, api = measure(args.samples)
    hook_ms, bare_ms = statistics.median(hook) * 1000, statistics.median(bare) * 1000
    api_ms = statistics.median(api) * 1000
    print(f"PreToolUse, auto-allowed (median of {len(hook)}): {hook_ms:.2f} ms")
    print(f"bare authenticated GET /api/v1/tools (median of {len(bare)}): {bare_ms:.2f} ms")
    print(f"the same read through the agent API (POST .../calls, median): {api_ms:.2f} ms")
    p90 = statistics.quantiles(hook, n=10)[-1] * 1000
    print(
        f"PreToolUse / bare: {hook_ms / bare_ms:.2f}x; PreToolUse / API submit: "
        f"{hook_ms / api_ms:.2f}x; PreToolUse p90 {p90:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
