"""The browser tests' shared data (tests/dashboard/test_browser.py, test_phone_width.py):
written once per session, so that generated decisions are never inserted twice."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from dispatcher.models import AgentSession
from tests.audit.test_timeline_compact import mixed_session
from tests.dashboard.history import generate_calls, generate_decisions
from tests.dashboard.test_analytics import NPM, History
from tests.support.factories import make_agent, make_user, unique
from tests.support.live import LiveStack


@pytest.fixture(scope="session")
def dashboard_data(live_stack: LiveStack, django_db_blocker: Any) -> Iterator[dict[str, Any]]:
    """A day of generated calls, a reviewed history, a session to read: written once."""
    with django_db_blocker.unblock():
        fixtures = [make_agent() for _ in range(3)]
        sessions = [
            str(
                AgentSession.objects.create(
                    agent=f.agent, team_id=f.agent.team_id, mode="standard", workspace="/w"
                ).pk
            )
            for f in fixtures
        ]
        # A week of calls, denser lately: 3,000 over the week and 1,500 in the last day.
        generate_calls(3000, sessions, timezone.now(), span=7 * 86400, step=201)
        generate_calls(1500, sessions, timezone.now(), span=86400, step=57, first=3001)
        generate_decisions(make_user(unique("rev")).pk)
        history = History()
        for i in range(20):
            history.decide("run_command", NPM, "alice", True, 8 + i % 5)
        for i in range(25):
            history.decide("read_file", {"path": f"notes/n{i}.txt"}, "bob", True, 0.5)
        owner = history.save()
        chain, _ = mixed_session()
        connection.close()
        yield {"owner": owner, "chain": chain, "agent": fixtures[0].agent}


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    target = Path(os.environ.get("HARNESS_SCREENSHOT_DIR") or tmp_path)
    target.mkdir(parents=True, exist_ok=True)
    return target
