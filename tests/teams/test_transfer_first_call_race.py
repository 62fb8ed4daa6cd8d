"""A hook's first call whose session is started while its agent is being moved to another
team (agents.transfer_agent), on PostgreSQL.

The move marks the sessions of the team the agent leaves (AgentSession.left_at) in its
transaction. A hook whose request read the agent before the move, and started its session
after the move's marking had read the sessions, committed a session of the former team
that was never marked: once the agent was moved back, the client's next call joined it
again (its grants, its record). The session is now started under the agent's row, which
the move holds from its first write to its commit (agents._lock_for_a_session): it waits,
and starts in the team the agent works for then."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import Client

from dispatcher import agents
from dispatcher.models import Agent, AgentSession, ToolCall
from tests.support.factories import unique
from tests.teams.world import make_team

pytestmark = pytest.mark.django_db(transaction=True)


def hook(headers: dict[str, str], session_id: str, command: str) -> Any:
    """Claude Code's pre-tool hook for a Bash command, in client session `session_id`."""
    return Client().post(
        "/api/v1/hooks/claude-code?wait=0",
        {
            "session_id": session_id,
            "hook_event_name": "PreToolUse",
            "cwd": "/work/project",
            "tool_name": "Bash",
            "tool_input": {"command": command},
            "tool_use_id": unique("t"),
        },
        content_type="application/json",
        headers=headers,
    )


def waiting_for_a_lock(pid: int) -> bool:
    """Whether a backend of this test database other than `pid`'s waits for a row lock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> %s AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'",
            [pid],
        )
        return bool(cursor.fetchone()[0])


def test_a_first_call_during_a_move_starts_no_session_of_the_former_team_that_is_not_left() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL (SQLite's write transactions run one at a time)")
    pay, away = make_team("pay"), make_team("away")
    fx, sid = pay.agent, unique("cc")
    moved, release = threading.Event(), threading.Event()
    mover: dict[str, Any] = {}
    answers: list[Any] = []

    def move() -> None:
        try:
            with transaction.atomic():
                agent = Agent.objects.get(pk=fx.agent.pk)
                assert agents.transfer_agent(agent=agent, team=away.team, actor="test")
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_backend_pid()")
                    mover["pid"] = cursor.fetchone()[0]
                moved.set()  # its sessions marked, its transaction still open
                assert release.wait(60)
        finally:
            moved.set()
            connections.close_all()

    def first_call() -> None:
        try:
            answers.append(hook(fx.headers, sid, "ls first"))
        finally:
            connections.close_all()

    mover_thread = threading.Thread(target=move)
    mover_thread.start()
    assert moved.wait(60) and "pid" in mover
    caller = threading.Thread(target=first_call)
    caller.start()
    # The first call either ends (before: its session committed past the move's marking)
    # or waits for the row the move holds (now). Either way the move commits next.
    deadline = time.monotonic() + 60
    while caller.is_alive() and not waiting_for_a_lock(mover["pid"]):
        assert time.monotonic() < deadline, "the first call neither ended nor waited"
        time.sleep(0.01)
    release.set()
    mover_thread.join(60)
    caller.join(60)
    assert [answer.status_code for answer in answers] == [200], answers

    [first] = ToolCall.objects.filter(session__agent=fx.agent, arguments={"command": "ls first"})
    session = first.session
    # No session of the team the agent left takes calls: the first call's session is of
    # the agent's new team (before: of its former team, not left).
    assert not AgentSession.objects.filter(
        agent=fx.agent, team=pay.team, external_id=sid, left_at__isnull=True
    ).exists()
    assert session.team_id == away.team.pk
    # Moved back, the client's next call does not join the session of that first call.
    assert agents.transfer_agent(
        agent=Agent.objects.get(pk=fx.agent.pk), team=pay.team, actor="test"
    )
    assert hook(fx.headers, sid, "ls back").status_code == 200
    back = ToolCall.objects.get(session__agent=fx.agent, arguments={"command": "ls back"})
    assert back.session_id != session.pk
    assert back.session.team_id == pay.team.pk and back.session.left_at is None
    session.refresh_from_db()
    assert session.left_at is not None
