"""The session list stays fast and its query count stays flat at 100,000 sessions."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import AuditChain
from tests.support.factories import make_user, unique

pytestmark = pytest.mark.django_db

SESSIONS = 100_000


def bulk_sessions(count: int) -> str:
    """`count` session summaries for one fresh agent name (with a few tools and outcomes)."""
    agent = unique("bulk-agent")
    now = timezone.now()
    rows = [
        AuditChain(
            chain=str(sid := uuid.uuid4()),
            session_id=sid,
            agent=agent if i % 2 else "other-" + agent,
            owner=f"owner{i % 50}",
            first_at=now - timedelta(minutes=i),
            last_at=now - timedelta(minutes=i) + timedelta(seconds=30),
            last_seq=5,
            last_hash="0" * 64,
            last_event_id=i,
            tools=" read_file write_file " if i % 3 else " run_command ",
            calls=3,
            completed=2,
            denied=i % 2,
        )
        for i in range(count)
    ]
    AuditChain.objects.bulk_create(rows, batch_size=5000)
    return agent


@pytest.mark.heavy
def test_session_list_over_100k_sessions(client: Client) -> None:
    agent = bulk_sessions(SESSIONS)
    auditor = make_user(unique("auditor"), groups=("auditor",))
    client.force_login(auditor)
    # The sign-in's first page writes its activity (identity.services.note_activity, at
    # most once a minute): the budget below is the list's own.
    assert client.get("/audit/sessions/", {"page": "1"}).status_code == 200
    for params in (
        {},
        {"agent": agent},
        {"tool": "run_command", "decision": "denied"},
        {"page": "400"},
    ):
        started = time.perf_counter()
        with CaptureQueriesContext(connection) as queries:
            response = client.get("/audit/sessions/", params)
        elapsed = time.perf_counter() - started
        assert response.status_code == 200
        assert len(queries) <= 8, [q["sql"][:120] for q in queries]
        assert elapsed < 5, f"{params}: {elapsed:.2f}s"  # a sanity bound; bench/ measures
    assert agent.encode() in client.get("/audit/sessions/", {"agent": agent}).content
