"""The overview: the landing page's figures are right, and stay cheap on a large history."""

from __future__ import annotations

import io
import json
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from audit.models import CheckpointRun
from dispatcher.models import AgentSession, ToolCall
from harness_site import charts, overview
from tests.audit.chains import write_chain
from tests.dashboard.history import OUTCOME_OF, generate_calls, generate_decisions
from tests.support.factories import make_agent, make_user, unique
from tests.support.live import free_port

pytestmark = pytest.mark.django_db


def history(count: int, days: int = 0, now: datetime | None = None) -> dict[str, Any]:
    """`count` generated calls in three agents' sessions (call i received i seconds ago, or
    spread evenly over `days`), approvals for the approved ones; returns the agents'
    names and the number of decisions."""
    now = now or timezone.now()
    fixtures = [make_agent() for _ in range(3)]
    sessions = [
        str(
            AgentSession.objects.create(
                agent=f.agent, team_id=f.agent.team_id, mode="standard", workspace="/w"
            ).pk
        )
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
    session = AgentSession.objects.create(
        agent=fx.agent, team_id=fx.agent.team_id, mode="standard", workspace="/w"
    )
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
    assert overview.checkpoint_status()["path"] == str(settings.HARNESS_CHECKPOINT_PATH)


@pytest.mark.heavy
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


def _safety_nets(html: str) -> str:
    """The text of the Safety nets card's checkpoint row, tags stripped."""
    row = html.split("<dt>Audit checkpoints</dt>", 1)[1].split("</dd>", 1)[0]
    return " ".join(re.sub(r"<[^>]+>", "", row).split())


def test_checkpoint_card_shows_the_last_real_run(
    admin_client: Client, settings: Any, tmp_path: Path
) -> None:
    settings.HARNESS_CHECKPOINT_PATH = str(tmp_path / "checkpoints.jsonl")
    settings.HARNESS_CHECKPOINT_URL = ""
    settings.HARNESS_CHECKPOINT_INTERVAL = 300
    card = _safety_nets(admin_client.get("/").content.decode())
    assert card.startswith("no run yet.") and "every 5 min (beat)" in card

    write_chain(2)
    call_command("audit_checkpoint", stdout=io.StringIO())
    lines = (tmp_path / "checkpoints.jsonl").read_text().splitlines()
    newest = datetime.fromisoformat(json.loads(lines[-1])["time"])
    card = _safety_nets(admin_client.get("/").content.decode())
    assert card.startswith("last run succeeded at "), card
    assert f"({len(lines)} heads signed)" in card
    assert f"Newest checkpoint: {newest:%Y-%m-%d %H:%M} UTC." in card
    assert f"To {tmp_path / 'checkpoints.jsonl'}, every 5 min (beat)." in card
    assert "is beat running?" not in card
    # Three intervals later with no run since: the card says beat may not be running.
    CheckpointRun.objects.update(finished_at=timezone.now() - timedelta(minutes=16))
    card = _safety_nets(admin_client.get("/").content.decode())
    assert "heads signed): none since; is beat running?" in card


def test_checkpoint_card_shows_a_failed_run_and_keeps_the_newest_checkpoint(
    admin_client: Client, settings: Any, tmp_path: Path
) -> None:
    path = tmp_path / "checkpoints.jsonl"
    settings.HARNESS_CHECKPOINT_PATH = str(path)
    settings.HARNESS_CHECKPOINT_INTERVAL = 0
    write_chain(1)
    call_command("audit_checkpoint", stdout=io.StringIO())
    newest = datetime.fromisoformat(json.loads(path.read_text().splitlines()[-1])["time"])
    # The next run may not reach its URL (loopback, not in HARNESS_OUTBOUND_ALLOW): the file
    # is written, the run failed, and the card says why without the URL's secret.
    settings.HARNESS_CHECKPOINT_URL = f"http://127.0.0.1:{free_port()}/checkpoints?token=secret"
    write_chain(1)
    with pytest.raises(CommandError, match="Could not write the checkpoint"):
        call_command("audit_checkpoint", stdout=io.StringIO())
    card = _safety_nets(admin_client.get("/").content.decode())
    assert card.startswith("last run failed: OutboundRefused: refused: a loopback address"), card
    assert "secret" not in card
    assert "Newest checkpoint: " in card and "none in the file yet" not in card
    assert f"{newest:%Y-%m-%d %H:%M}" <= card.split("Newest checkpoint: ")[1][:16]
    assert "and http://127.0.0.1, not scheduled (HARNESS_CHECKPOINT_INTERVAL is 0)." in card


def _axis(html: str, chart: str) -> tuple[list[tuple[float, str]], list[str]]:
    """A chart's ticks (x %, label) and its bars' titles, in order."""
    figure = html.split(f'id="{chart}-caption"', 1)[1].split("</figure>", 1)[0]
    titles = re.findall(r"<title>([^<]*): \d+</title>", figure)
    ticks = re.findall(r'<line x1="([\d.]+)%".*?<text [^>]*>([^<]*)</text>', figure)
    return [(float(x), label) for x, label in ticks], titles


def test_chart_ticks_stand_at_their_times_and_label_the_current_hour_and_today(
    admin_client: Client,
) -> None:
    history(50)  # calls in the last minute: every chart is drawn
    for _attempt in range(3):
        before = timezone.now()
        html = admin_client.get("/").content.decode()
        if timezone.now().hour == before.hour:
            break  # not cut by the turn of an hour
    now = before.astimezone(UTC)
    assert "Last 24 hours, hours in UTC" in html and "Last 7 days, days in UTC" in html

    ticks, titles = _axis(html, "day")
    assert len(titles) == 24 and titles[-1] == f"{now:%H}:00"
    assert ticks[-1] == (pytest.approx(100 * 23.5 / 24, abs=0.01), f"{now:%H}:00")
    for x, label in ticks:  # each under the middle of the bar of its hour
        assert x == pytest.approx(100 * (titles.index(label) + 0.5) / 24, abs=0.01)
    assert [label for _, label in ticks] == titles[3::4]

    ticks, titles = _axis(html, "week")
    assert len(titles) == 168 and titles[-1] == f"{now:%a %d %H}:00"
    midnights = [i for i, title in enumerate(titles) if title.endswith(" 00:00")]
    assert [label for _, label in ticks] == [titles[i][:-6] for i in midnights]
    assert ticks[-1][1] == f"{now:%a %d}"  # today is labelled
    for (x, _label), i in zip(ticks, midnights, strict=True):  # at midnight, its time
        assert x == pytest.approx(100 * i / 168, abs=0.01)


def test_edge_labels_stay_inside_the_chart_and_the_newest_day_is_labelled() -> None:
    days = [f"2026-12-{d:02d} 00:00:00" for d in range(1, 15)]
    ticks = charts.bar_ticks(days, lambda b: b[8:10], every=2)
    assert [t.label for t in ticks] == ["02", "04", "06", "08", "10", "12", "14"]
    assert ticks[-1] == charts.Tick(96.429, "14", 100.0, "end")
    assert ticks[0] == charts.Tick(10.714, "02", 10.714, "middle")
    hours = [f"2026-12-01 {h:02d}:00:00" for h in range(24)]
    first = charts.bar_ticks(hours, lambda b: b[11:16], every=1)[0]
    assert (first.x, first.text_x, first.anchor) == (2.083, 0.0, "start")
