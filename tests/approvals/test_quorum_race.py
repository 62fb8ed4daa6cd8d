"""Two reviewers casting the last missing approval at once: exactly one execution."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.conf import settings
from django.db import connection

from approvals.models import ApprovalRequest, Vote
from audit.models import AuditEvent
from dispatcher.models import TERMINAL_STATUSES, Status, ToolCall
from dispatcher.policy import profiles
from tests.approvals.test_concurrent_decisions import reviewer_client
from tests.support.factories import make_agent
from tests.support.live import LiveStack

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
        reason="row locks under real concurrency are a PostgreSQL behaviour",
    ),
]

CALLS = 12


def test_racing_last_votes_approve_once_and_the_call_runs_once(
    live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="standard")
    profiles.update_profile(
        user=fx.owner,
        mode="standard",
        allow=[],
        ask=[{"rule": "write_file", "approvals": 2}],
        deny=[],
        actor="test",
    )
    with live_stack.client(fx) as client:
        session = client.post("/api/v1/sessions", json={}).json()["id"]
        for index in range(CALLS):
            args = {"path": f"q{index}.txt", "content": str(index)}
            body = {"calls": [{"id": f"q{index}", "name": "write_file", "arguments": args}]}
            response = client.post(f"/api/v1/sessions/{session}/calls", json=body)
            assert response.json()["calls"][0]["status"] == "pending_approval"
    approvals = list(
        ApprovalRequest.objects.filter(call__session_id=session).select_related("call")
    )
    assert all(a.approvals_required == 2 for a in approvals)
    first, *racers = [reviewer_client(live_stack) for _ in range(3)]

    def post(client: httpx.Client, approval: ApprovalRequest) -> int:
        data = {"action": "approve", "digest": approval.call.digest}
        return client.post(f"/approvals/{approval.pk}/decide", data=data).status_code

    for approval in approvals:
        assert post(first, approval) == 200  # 1 of 2
    outcomes: list[list[int]] = []
    for approval in approvals:
        barrier = threading.Barrier(len(racers))

        def attempt(
            client: httpx.Client,
            approval: ApprovalRequest = approval,
            barrier: threading.Barrier = barrier,
        ) -> int:
            barrier.wait(10)
            return post(client, approval)

        with ThreadPoolExecutor(len(racers)) as pool:
            outcomes.append(sorted(pool.map(attempt, racers)))
    for client in (first, *racers):
        client.close()

    assert outcomes == [[200, 409]] * CALLS
    ids = [a.call_id for a in approvals]
    assert Vote.objects.filter(approval__in=approvals).count() == 2 * CALLS
    subjects = [f"call:{i}" for i in ids]
    approved = AuditEvent.objects.filter(subject__in=subjects, kind="call.approved")
    assert sorted(approved.values_list("subject", flat=True)) == sorted(subjects)
    deadline = time.monotonic() + 30
    while ToolCall.objects.filter(pk__in=ids).exclude(status__in=TERMINAL_STATUSES).exists():
        assert time.monotonic() < deadline, "approved calls did not finish"
        time.sleep(0.1)
    started = list(
        AuditEvent.objects.filter(subject__in=subjects, kind="call.started").values_list(
            "subject", flat=True
        )
    )
    assert sorted(started) == sorted(subjects)  # each ran, and exactly once
    assert ToolCall.objects.filter(pk__in=ids, status=Status.COMPLETED).count() == CALLS
    connection.close()
