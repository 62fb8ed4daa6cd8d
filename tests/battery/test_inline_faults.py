"""C-inline: kill -9 of the daphne running an inline call (issue 37; docs/mcp.md, "The
inline lane"). An auto-allowed call of an upstream HTTP server's tool runs in the daphne
that admitted it, claimed in the admission's commit, without the queue. The daphne is
killed while the upstream is running the call: the call ends outcome_unknown once its
lease has passed (the reconciler, as for a worker that died), the upstream received it
exactly once, the agent reads that outcome through another daphne, and every chain
verifies. Against two daphnes (one killed per call), a Celery worker and a beat
(reconciler every second) this test starts, and a real upstream HTTP MCP server."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from audit.models import AuditEvent
from audit.verify import verify_database
from dispatcher.models import Status, ToolCall
from dispatcher.tools.sources import services
from tests.battery import figures
from tests.battery.conftest import size
from tests.battery.procs import Stack, port_open, wait_until
from tests.support.factories import make_agent
from tests.support.live import free_port
from tests.support.mcp_requests import initialize
from tests.support.paths import ROOT

UPSTREAM = ROOT / "tests" / "support" / "mcp_upstream.py"
KILLS = size(2, 10)
TIMEOUT = 4  # the server's timeout: the lease is this plus HARNESS_LEASE_GRACE
SLEEP = 3.0  # what each call asks the upstream to take
ACCEPT = "application/json, text/event-stream"
# After the last call ended: a re-run would come from a reconciler pass or a stray
# delivery within a lease or two.
SETTLE = 2 * (TIMEOUT + 1)


def _initialize(base: str, headers: dict[str, str]) -> str:
    with httpx.Client(base_url=base, timeout=30) as client:
        answer = client.post("/mcp/", json=initialize("battery-inline"), headers=headers)
    assert answer.status_code == 200, answer.text
    return str(answer.headers["mcp-session-id"])


def _started(calls_file: Path) -> int:
    return len(calls_file.read_text().splitlines()) if calls_file.exists() else 0


@pytest.mark.timeout(900)
def test_c_inline_a_daphne_killed_mid_call_ends_it_outcome_unknown_once(
    stack: Stack, tmp_path: Path, settings: Any
) -> None:
    port = free_port()
    calls_file = tmp_path / "upstream-calls.txt"
    upstream_env = {**stack.env, "UPSTREAM_CALLS_FILE": str(calls_file)}
    stack.group.start("upstream", [sys.executable, str(UPSTREAM), "http", str(port)], upstream_env)
    wait_until(lambda: port_open(port), 30, "the upstream to listen")
    settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{port}"]  # this process registers it
    name = "s" + uuid.uuid4().hex[:8]
    services.add_server(
        name=name,
        actor="battery",
        url=f"http://127.0.0.1:{port}/mcp",
        trust_annotations=True,
        timeout=TIMEOUT,
    )
    survivor = stack.daphne()
    stack.worker(2)
    stack.beat()
    ended_after: list[float] = []
    errors: list[str] = []
    ids: list[str] = []
    tokens: list[str] = []
    for i in range(KILLS):
        # An agent per call: new sessions of one agent are rate-limited per minute.
        fx = make_agent(mode="trusted")
        headers = {"Authorization": f"Bearer {fx.token}", "Accept": ACCEPT}
        victim = stack.daphne()
        session = _initialize(victim, headers)
        body = {
            "jsonrpc": "2.0",
            "id": i + 1,
            "method": "tools/call",
            "params": {"name": f"{name}__slow", "arguments": {"seconds": SLEEP}},
        }

        def call(
            base: str = victim,
            sid: str = session,
            request: dict[str, Any] = body,
            sent: dict[str, str] = headers,
        ) -> None:
            with contextlib.suppress(httpx.HTTPError):  # its daphne dies under it
                with httpx.Client(base_url=base, timeout=60) as client:
                    answer = client.post(
                        "/mcp/", json=request, headers={**sent, "Mcp-Session-Id": sid}
                    )
                errors.append(f"{sid} answered {answer.status_code}: {answer.text[:200]}")

        caller = threading.Thread(target=call)
        caller.start()
        wait_until(
            lambda n=i: _started(calls_file) > n or bool(errors), 60, "the upstream to start it"
        )
        assert not errors, errors  # answered before it ran: refused, or not kept inline
        process = next(p for p, url in stack.daphnes if url == victim)
        process.kill9()
        killed = time.monotonic()
        caller.join(60)
        stored = ToolCall.objects.filter(session__agent=fx.agent).order_by("-created_at").first()
        assert stored is not None and stored.status == Status.RUNNING, stored
        ids.append(str(stored.pk))
        tokens.append(fx.token)
        wait_until(
            lambda pk=stored.pk: ToolCall.objects.get(pk=pk).status == Status.OUTCOME_UNKNOWN,
            120,
            "the reconciler to end the call",
        )
        ended_after.append(round(time.monotonic() - killed, 2))

    time.sleep(SETTLE)  # (absence of a re-run: nothing to wait on but time)
    calls = list(ToolCall.objects.filter(pk__in=ids))
    outcomes = sorted({(c.status, c.attempts) for c in calls})
    executions = _started(calls_file)
    seen = []
    for call_id, token in zip(ids, tokens, strict=True):
        with httpx.Client(base_url=survivor, headers={"Authorization": f"Bearer {token}"}) as c:
            seen.append(c.get(f"/api/v1/calls/{call_id}").json().get("status"))
    trails = {
        tuple(
            AuditEvent.objects.filter(subject=f"call:{c.pk}")
            .order_by("seq")
            .values_list("kind", flat=True)
        )
        for c in calls
    }
    report = verify_database()
    lease = TIMEOUT + settings.HARNESS_LEASE_GRACE
    passed = [
        figures.record(
            "C-inline",
            "calls whose daphne was killed mid-run / ended outcome_unknown, attempt 1",
            f"{KILLS} / {sum((c.status, c.attempts) == (Status.OUTCOME_UNKNOWN, 1) for c in calls)}",
            "all",
            outcomes == [(Status.OUTCOME_UNKNOWN, 1)],
        ),
        figures.record(
            "C-inline",
            "upstream executions / calls",
            f"{executions} / {KILLS}",
            "equal (never re-run)",
            executions == KILLS,
        ),
        figures.record(
            "C-inline",
            "kill to outcome_unknown (s), worst",
            max(ended_after),
            f"< lease ({lease:g} s) + 30",
            max(ended_after) < lease + 30,
            each=ended_after,
        ),
        figures.record(
            "C-inline",
            "agent reads the outcome through the other daphne; chains verify",
            f"{sorted(set(seen))}; {report.ok}",
            "outcome_unknown; True",
            set(seen) == {"outcome_unknown"} and report.ok,
        ),
    ]
    assert not errors, errors  # no answer came from a daphne that was killed
    assert trails == {("call.received", "call.allowed", "call.started", "call.outcome_unknown")}
    assert all(passed), (outcomes, executions, ended_after, seen, report.problems[:3])
