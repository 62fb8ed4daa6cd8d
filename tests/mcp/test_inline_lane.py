"""The inline lane (issue 37; docs/mcp.md, "The inline lane"): an auto-allowed call of an
upstream HTTP server's tool is claimed and run by the request that admitted it, without
the queue, with the same records as the worker's run; the worker is the fallback."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from audit.models import AuditEvent
from dispatcher.gateways import mcp
from dispatcher.gateways.mcp_http import authenticate, open_session
from dispatcher.models import Status, ToolCall
from dispatcher.proposals import ProposedCall, canonical_json
from tests.support.factories import make_agent
from tests.support.live import free_port, stop, wait_for_port
from tests.support.paths import ROOT

UPSTREAM = ROOT / "tests" / "support" / "mcp_upstream.py"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def http_server(tmp_path: Path, settings: Any) -> Iterator[str]:
    """A streamable HTTP upstream registered as a server with a fresh name; its name."""
    port = free_port()
    settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{port}"]
    log = tmp_path / "upstream-http.log"
    proc = subprocess.Popen(
        [sys.executable, str(UPSTREAM), "http", str(port)],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, proc, log)
        name = "s" + uuid.uuid4().hex[:8]
        call_command(
            "add_mcp_server",
            name,
            "--url",
            f"http://127.0.0.1:{port}/mcp",
            "--trust-annotations",
            stdout=StringIO(),
        )
        yield name
    finally:
        stop(proc)


def proposed(tool_use_id: str, name: str, arguments: dict[str, Any]) -> ProposedCall:
    return ProposedCall(tool_use_id, name, canonical_json(arguments), arguments)


def data_statements(queries: CaptureQueriesContext) -> list[str]:
    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK")
    return [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(control)]


def test_an_allowed_upstream_http_call_runs_in_the_request_with_the_workers_records(
    http_server: str,
) -> None:
    fx = make_agent(mode="trusted")
    session = open_session(fx.agent, {})
    _, loaded = authenticate(fx.token, session.external_id)
    assert loaded is not None
    name = f"{http_server}__echo"
    mcp.submit(loaded, proposed("mcp:0", name, {"text": "warm"}), preloaded=True)
    _, loaded = authenticate(fx.token, session.external_id)
    assert loaded is not None
    with CaptureQueriesContext(connection) as queries:
        call = mcp.submit(loaded, proposed("mcp:1", name, {"text": "inline"}), preloaded=True)
    # Answered from the request's own run: nothing left for a worker, nothing to re-read.
    assert call.status == Status.COMPLETED and call.content == "echo: inline"
    stored = ToolCall.objects.get(pk=call.pk)
    assert (stored.status, stored.content, stored.attempts) == (Status.COMPLETED, call.content, 1)
    assert stored.enqueued_at is not None  # marked sent: the reconciler's fallback
    kinds = list(
        AuditEvent.objects.filter(subject=f"call:{call.pk}")
        .order_by("seq")
        .values_list("kind", flat=True)
    )
    assert kinds == ["call.received", "call.allowed", "call.started", "call.completed"]
    sql = data_statements(queries)
    commits = [q for q in queries.captured_queries if q["sql"] == "COMMIT"]
    print("\n".join(s[:160] for s in sql))
    assert len(sql) <= 99, sql
    assert len(commits) <= 99
