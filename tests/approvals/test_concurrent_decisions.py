"""Exactly one decision per call under real concurrent requests (live daphne, PostgreSQL)."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from dispatcher.models import TERMINAL_STATUSES, Status, ToolCall
from tests.approvals.conftest import session_cookie
from tests.support.factories import AgentFixture, make_user, unique
from tests.support.live import LiveStack

pytestmark = pytest.mark.live

CALLS = 50


def reviewer_client(stack: LiveStack) -> httpx.Client:
    """An httpx client signed in as a fresh reviewer, with its CSRF token as a header."""
    django_client = Client()
    django_client.force_login(make_user(unique("rev"), groups=("reviewer",)))
    name, value = session_cookie(django_client).decode().split("=", 1)
    client = httpx.Client(base_url=stack.url, cookies={name: value}, timeout=30)
    assert client.get("/approvals/").status_code == 200
    client.headers["X-CSRFToken"] = client.cookies["csrftoken"]
    client.headers["HX-Request"] = "true"
    return client


def pending_calls(stack: LiveStack, fx: AgentFixture, sessions: int = 10) -> list[ApprovalRequest]:
    """CALLS pending write_file calls spread over `sessions` sessions (each session's audit
    chain is locked per append, so one session would serialize every decision)."""
    with stack.client(fx) as client:
        session_ids = [
            client.post("/api/v1/sessions", json={}).json()["id"] for _ in range(sessions)
        ]

        def submit(index: int) -> None:
            args = {"path": f"f{index}.txt", "content": str(index)}
            body = {"calls": [{"id": f"c{index}", "name": "write_file", "arguments": args}]}
            url = f"/api/v1/sessions/{session_ids[index % sessions]}/calls"
            response = client.post(url, json=body)
            assert response.json()["calls"][0]["status"] == "pending_approval"

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(submit, range(CALLS)))
    approvals = ApprovalRequest.objects.filter(call__session_id__in=session_ids)
    return list(approvals.select_related("call"))


@pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="row locks under real concurrency are a PostgreSQL behaviour",
)
def test_each_call_gets_exactly_one_decision_and_runs_at_most_once(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    approvals = pending_calls(live_stack, live_agent)
    assert len(approvals) == CALLS
    reviewers = [reviewer_client(live_stack) for _ in range(8)]
    rng = random.Random(3)

    def race(approval: ApprovalRequest) -> list[tuple[int, str]]:
        contenders = rng.sample(reviewers, rng.randint(2, 8))
        barrier = threading.Barrier(len(contenders))

        def attempt(client: httpx.Client) -> tuple[int, str]:
            action = rng.choice(["approve", "deny"])
            barrier.wait(10)
            response = client.post(
                f"/approvals/{approval.pk}/decide",
                data={"action": action, "digest": approval.call.digest},
            )
            return response.status_code, response.text

        with ThreadPoolExecutor(len(contenders)) as pool:
            return list(pool.map(attempt, contenders))

    with ThreadPoolExecutor(6) as pool:  # six calls raced at a time, 2-8 requests each
        outcomes = list(pool.map(race, approvals))
    for reviewer in reviewers:
        reviewer.close()

    for answers in outcomes:
        assert sorted(status for status, _ in answers)[0] == 200
        assert [status for status, _ in answers].count(200) == 1, answers
        for status, text in answers:
            assert status == 200 or (status == 409 and "Already decided by" in text), text
    ids = [a.call_id for a in approvals]
    assert ApprovalRequest.objects.filter(call_id__in=ids).exclude(decision="").count() == CALLS
    subjects = [f"call:{i}" for i in ids]
    decisions = AuditEvent.objects.filter(
        subject__in=subjects, kind__in=["call.approved", "call.denied"]
    )
    assert sorted(decisions.values_list("subject", flat=True)) == sorted(subjects)

    approved = ToolCall.objects.filter(pk__in=ids, decision="allow").count()
    assert 0 < approved < CALLS  # both kinds of decision took part in the races
    deadline = time.monotonic() + 30
    while ToolCall.objects.filter(pk__in=ids).exclude(status__in=TERMINAL_STATUSES).exists():
        assert time.monotonic() < deadline, "approved calls did not finish"
        time.sleep(0.1)
    started = list(
        AuditEvent.objects.filter(subject__in=subjects, kind="call.started").values_list(
            "subject", flat=True
        )
    )
    assert len(started) == len(set(started)) == approved  # nothing ran twice
    assert ToolCall.objects.filter(pk__in=ids, status=Status.COMPLETED).count() == approved
    connection.close()
