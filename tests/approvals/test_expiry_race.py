"""Approvals racing their own expiry: each call ends approved or expired, never both."""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from approvals import services
from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from dispatcher.models import Status, ToolCall
from tests.approvals.conftest import ask, start_session
from tests.support.factories import make_agent, make_user, unique

CALLS = 20


@pytest.mark.heavy
@pytest.mark.django_db(transaction=True)
def test_approve_racing_expiry_decides_each_call_once() -> None:
    fx = make_agent(mode="standard")
    reviewer = make_user(unique("rev"), groups=("reviewer",))
    session_id = start_session(fx)
    approvals = [
        ask(fx, {"path": f"f{i}.txt", "content": "x"}, session_id=session_id, call_id=f"c{i}")
        for i in range(CALLS)
    ]
    deadline = timezone.now() + timedelta(seconds=0.4)
    ApprovalRequest.objects.filter(pk__in=[a.pk for a in approvals]).update(expires_at=deadline)
    outcomes: dict[int, str] = {}
    stop = threading.Event()

    def sweep() -> None:
        try:
            while not stop.is_set():
                services.expire_due()
                time.sleep(0.01)
        finally:
            connection.close()

    def decide(approval: Any) -> None:
        try:
            time.sleep(random.uniform(0.2, 0.6))  # some before the deadline, some after
            services.decide(
                approval_id=approval.pk, user=reviewer, approve=True, digest=approval.digest
            )
            outcomes[approval.pk] = "approved"
        except services.DecisionRefused as refused:
            assert refused.status == 409 and "Already decided by expiry" in str(refused)
            outcomes[approval.pk] = "refused"
        finally:
            connection.close()

    sweeper = threading.Thread(target=sweep)
    sweeper.start()
    deciders = [threading.Thread(target=decide, args=(a,)) for a in approvals]
    for t in deciders:
        t.start()
    for t in deciders:
        t.join()
    stop.set()
    sweeper.join()

    for approval in approvals:
        call = ToolCall.objects.get(pk=approval.call_id)
        decided = AuditEvent.objects.filter(
            subject=f"call:{call.pk}", kind__in=["call.approved", "call.expired"]
        )
        assert decided.count() == 1, (call.pk, list(decided.values_list("kind", flat=True)))
        if outcomes[approval.pk] == "approved":
            assert call.status == Status.QUEUED and decided.get().kind == "call.approved"
            # Decided (its time checked against the deadline, under the lock) before it.
            assert ApprovalRequest.objects.get(pk=approval.pk).decided_at < deadline
        else:
            assert call.status == Status.EXPIRED and decided.get().kind == "call.expired"
