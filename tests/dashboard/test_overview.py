"""The overview: the landing page's figures are right, and stay cheap on a large history."""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from dispatcher.models import AgentSession, ToolCall
from harness_site import overview
from tests.conftest import make_agent, make_user, unique
from tests.dashboard.history import OUTCOME_OF, generate_calls, generate_decisions

pytestmark = pytest.mark.django_db


def history(count: int, days: int = 0, now: datetime | None = None) -> dict[str, Any]:
    """`count` generated calls in three agents' sessions (call i received i seconds ago, or
    spread evenly over `days`), approvals for the approved ones; returns the agents'
    names and the number of decisions."""
    now = now or timezone.now()
    fixtures = [make_agent() for _ in range(3)]
    sessions = [
        str(AgentSession.objects.create(agent=f.agent, mode="standard", workspace="/w").pk)
        for f in fixtures
    ]
    span = days * 86400
    if span:
        generate_calls(count, sessions, now, span=span, step=max(1, span // count))
    else:
        generate_calls(count, sessions, now)
    reviewer = make_user(unique("rev"), groups=("reviewer",))
    decisions = generate_decisions(reviewer.pk)
    return {"now": now, "agents": [f.agent.name for f in fixtures], "decisions": decisions}


@pytest.fixture
def admin_client(client: Client) -> Client:
    client.force_login(make_user(unique("admin"), groups=("admin", "reviewer", "auditor")))
    return client


# Known-answer tests look at a week long ago, where live tests elsewhere (which commit
# calls of their own, now) leave nothing.
LONG_AGO = timedelta(days=400)


def test_calls_by_outcome_match_the_generated_history() -> None:
    made = history(2000, now=timezone.now() - LONG_AGO)
    figures = overview.overview(made["now"])
    totals = figures["week"].totals()
    expected: dict[str, int] = {}
    for i in range(1, 2001):
        series = OUTCOME_OF[i % 10][4]
        expected[series] = expected.get(series, 0) + 1
    assert {k: v for k, v in totals.items() if v} == expected
    # The last day is the calls received less than 24 hours ago (i seconds ago, i <= 2000).
    assert sum(figures["day"].totals().values()) == 2000
    assert sorted(figures["busiest"]["tools"]) == [
        ("list_directory", 500),
        ("read_file", 500),
        ("run_command", 500),
        ("write_file", 500),
    ]
    assert sorted(n for _, n in figures["busiest"]["agents"]) == [666, 667, 667]
    assert sorted(name for name, _ in figures["busiest"]["agents"]) == sorted(made["agents"])


def test_time_to_decision_percentiles_per_day() -> None:
    made = history(600, now=timezone.now() - LONG_AGO)  # 60 approvals, 1..60 s each
    assert made["decisions"] == 60
    later = made["now"] + timedelta(minutes=2)  # the newest asks are decided after "now"
    days = [d for d in overview.decision_times(later) if d.decisions]
    assert sum(d.decisions for d in days) == 60
    waits = sorted(((i % 60) + 1) for i in range(1, 601) if i % 10 == 6)
    if len(days) == 1:  # all within one UTC day (unless generated across midnight)
        day = days[0]
        assert day.p50 == pytest.approx(waits[len(waits) // 2 - 1], abs=1.01)
        assert day.p90 == pytest.approx(waits[int(len(waits) * 0.9) - 1], abs=1.01)
        assert day.p50 < day.p90


def test_pending_asks_and_the_oldest() -> None:
    fx = make_agent()
    session = AgentSession.objects.create(agent=fx.agent, mode="standard", workspace="/w")
    for minutes in (3, 40):
        call = ToolCall.objects.create(
            session=session,
            tool_use_id=unique("t"),
            name="write_file",
            raw_arguments="{}",
            digest="",
            dialect="native",
            batch_id=session.pk,
            batch_index=0,
            status="pending_approval",
        )
        ToolCall.objects.filter(pk=call.pk).update(
            created_at=timezone.now() - timedelta(minutes=minutes)
        )
    found = overview.pending(timezone.now())
    assert found["count"] >= 2  # live tests elsewhere may leave asks of their own
    assert found["waited"] > timedelta(minutes=39)


def test_the_landing_page_is_the_overview_for_signed_in_users(
    client: Client, admin_client: Client
) -> None:
    assert Client().get("/").status_code == 302  # anonymous: sign in first
    history(300)
    page = admin_client.get("/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "<h1>Overview</h1>" in html and "Waiting for a reviewer" in html
    assert html.count("<svg") >= 3 and "<script" not in html.split("<main>")[1]
    # The numbers are there as tables for screen readers.
    assert "<caption>Calls per hour in the last 24 hours, by outcome</caption>" in html
    assert re.search(r"<th scope=\"col\">allowed by mode</th>", html)
    assert 'style="' not in html  # nothing the CSP would block


def test_a_user_without_a_role_sees_no_figures(client: Client) -> None:
    client.force_login(make_user(unique("nobody")))
    html = client.get("/").content.decode()
    assert "hold no role" in html and "<svg" not in html


def test_sandbox_and_checkpoint_status_never_fail(settings: Any) -> None:
    settings.HARNESS_SANDBOX = "none"
    assert overview.sandbox_status()["enabled"] is False
    settings.HARNESS_SANDBOX = "no-such-sandbox-binary"
    status = overview.sandbox_status()
    assert status["enabled"] and status["found"] is None
    assert "error" not in overview.checkpoint_status()


def test_queries_are_bounded_and_fast_on_a_large_history(
    admin_client: Client, django_assert_max_num_queries: Any
) -> None:
    history(200_000, days=30)  # a month: the week's figures read 50,000 of them
    admin_client.get("/")  # warm: session, groups
    started = time.perf_counter()
    with django_assert_max_num_queries(12):
        response = admin_client.get("/")
    seconds = time.perf_counter() - started
    assert response.status_code == 200
    print(f"overview over 200,000 calls: {seconds:.2f} s")
    assert seconds < 8, seconds  # generous: a shared 2-core machine; the figure is the point


@pytest.mark.slow
def test_a_million_calls(admin_client: Client) -> None:
    history(1_000_000, days=60)
    admin_client.get("/")
    started = time.perf_counter()
    assert admin_client.get("/").status_code == 200
    seconds = time.perf_counter() - started
    print(f"overview over 1,000,000 calls: {seconds:.2f} s")
    assert seconds < 20, seconds
