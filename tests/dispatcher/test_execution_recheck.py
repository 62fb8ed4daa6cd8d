"""The worker re-runs the guards just before execution: time has passed since admission."""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.models import AuditEvent
from dispatcher import agents, execution, transitions
from dispatcher.agents import start_session
from dispatcher.models import Status, ToolCall
from dispatcher.policy import profiles
from tests.support.factories import make_agent, submit_one

pytestmark = pytest.mark.django_db


def test_a_symlink_planted_after_admission_is_caught_by_the_worker(tmp_path: Path) -> None:
    fx = make_agent(mode="trusted")
    session = start_session(agent=fx.agent)
    workspace = Path(session.workspace)
    (workspace / "build").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    call = submit_one(session, "write_file", {"path": "build/out.txt", "content": "x"})
    assert call.status == Status.QUEUED
    (workspace / "build").rmdir()
    (workspace / "build").symlink_to(outside)  # the path now leads outside the workspace

    execution.execute_call(str(call.pk))

    call.refresh_from_db()
    assert call.status == Status.DENIED
    assert call.decided_by == "guard:workspace_confinement"
    assert "outside the session workspace" in call.content
    assert not (outside / "out.txt").exists()
    event = AuditEvent.objects.get(subject=f"call:{call.pk}", kind="call.denied")
    assert event.payload["stage"] == "execute"


def test_a_call_that_is_not_queued_is_never_executed() -> None:
    fx = make_agent(mode="standard")
    session = start_session(agent=fx.agent)
    call = submit_one(session, "write_file", {"path": "f.txt", "content": "x"})
    assert call.status == Status.PENDING_APPROVAL
    execution.execute_call(str(call.pk))
    assert ToolCall.objects.get(pk=call.pk).status == Status.PENDING_APPROVAL
    assert not (Path(session.workspace) / "f.txt").exists()


def test_a_queued_call_does_not_run_after_its_owner_is_locked() -> None:
    fx = make_agent(mode="trusted")
    session = start_session(agent=fx.agent)
    call = submit_one(session, "write_file", {"path": "f.txt", "content": "x"})
    assert call.status == Status.QUEUED
    profiles.set_mode(user=fx.owner, mode="locked", actor="test")

    execution.execute_call(str(call.pk))

    call.refresh_from_db()
    assert call.status == Status.DENIED
    assert call.decided_by == "guard:mode_ceiling"
    assert "locked mode" in call.content
    assert not (Path(session.workspace) / "f.txt").exists()


def test_an_approved_call_of_a_revoked_agent_does_not_run() -> None:
    fx = make_agent(mode="standard")
    session = start_session(agent=fx.agent)
    call = submit_one(session, "write_file", {"path": "f.txt", "content": "x"})
    agents.revoke_agent(agent=fx.agent, actor="test")
    # (The release itself is conditional on the credential: transitions._release_approved.
    # A decision through approvals.services refuses it before, saying "was revoked"; this
    # one, past that check, is denied at the release and never queued.)
    assert transitions.approve_call(call_id=call.pk, actor="user:rita")

    execution.execute_call(str(call.pk))

    call.refresh_from_db()
    assert call.status == Status.DENIED and call.decided_by == "guard:token", call.status
    assert "no longer acts for the agent" in call.content
    assert call.started_at is None
    assert not (Path(session.workspace) / "f.txt").exists()
