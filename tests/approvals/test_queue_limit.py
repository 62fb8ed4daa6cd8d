"""A long queue: pages and (re)connects carry the oldest requests only, and say how many
more wait; the history of a long session stays bounded."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals import live, queries
from teams.scope import EVERYTHING
from tests.approvals.conftest import ask, start_session
from tests.support.factories import AgentFixture

pytestmark = pytest.mark.django_db


def test_queue_shows_the_oldest_requests_and_counts_the_rest(
    client: Client, reviewer: User, agent: AgentFixture, monkeypatch: Any
) -> None:
    monkeypatch.setattr(queries, "QUEUE_LIMIT", 3)
    session = start_session(agent)
    for i in range(5):
        ask(agent, {"path": f"f{i}.txt", "content": "x"}, session_id=session, call_id=f"c{i}")
    client.force_login(reviewer)
    page = client.get("/approvals/").content.decode()
    assert page.count('class="approval') >= 3
    assert "f0.txt" in page and "f2.txt" in page and "f3.txt" not in page
    assert "2 more are waiting" in page
    assert "2 more are waiting" in live.render_queue(EVERYTHING)


@pytest.mark.heavy
def test_history_of_a_long_session_is_bounded_and_costs_one_query(agent: AgentFixture) -> None:
    session = start_session(agent)
    for i in range(30):
        ask(agent, {"path": f"f{i}.txt", "content": "x"}, session_id=session, call_id=f"c{i}")
    approvals, _ = queries.review_queue(EVERYTHING)
    last = approvals[-1]
    with CaptureQueriesContext(connection) as captured:
        queries.attach_history([last])
    assert len(captured) == 1
    assert len(last.history) == queries.HISTORY_LIMIT
    assert last.history[-1].tool_use_id == "c28"  # the newest earlier call, last
