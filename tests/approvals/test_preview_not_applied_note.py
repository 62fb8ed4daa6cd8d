"""An approved preview that could not be applied runs the command for real: the model's
result says so in one line after the output (why, in fixed words that name no path
outside the workspace), and the result's audit event records that a preview existed, was
not appliable, and why. An applied preview's result carries no such note. Real git, real
bwrap, the worker's own code path; the agent's answer read from its API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from audit.models import AuditEvent
from dispatcher import execution
from dispatcher.models import Preview, Status, ToolCall
from tests.approvals.conftest import ask, start_session
from tests.approvals.test_edit import api_call
from tests.approvals.test_preview_approval import _ask_script, _workspace, reviewer_client
from tests.approvals.test_preview_outside_git import previews_on
from tests.support.factories import AgentFixture
from tests.support.git_preview import approve as _approve
from tests.support.git_preview import git as _git
from tests.support.git_preview import team as _team

pytestmark = pytest.mark.django_db
__all__ = ["previews_on", "reviewer_client"]  # the fixtures, used by name

NOTE = "[Note: the approved preview of this 'run_command' call could not be applied ("
RAN = "), so the command ran for real after the approval; the result above is that run's.]"


def test_a_gap_in_the_fingerprint_is_said_to_the_model_and_in_the_audit(
    previews_on: None,
    agent: AgentFixture,
    reviewer_client: Client,
    settings: Any,
    tmp_path: Path,
) -> None:
    team = _team(tmp_path, settings)
    (team / "greet.sh").write_text("#!/bin/sh\necho hello\n")
    session_id = start_session(agent)
    workspace = _workspace(agent)
    _git(workspace, "init", "-q")
    # (in a configuration outside the workspace: the reviewer's note names its path)
    (team / "team.gitconfig").write_text(f"[alias]\n\tgreet = !cd {team} && sh greet.sh\n")
    _git(workspace, "config", "include.path", str(team / "team.gitconfig"))
    argv = ["sh", "-c", "git greet > greeting.txt; echo said"]
    approval = ask(agent, {"argv": argv}, session_id=session_id, name="run_command")
    row = Preview.objects.get(call=approval.call)
    assert not row.appliable and str(team) in row.note  # the reviewer is shown where
    _approve(reviewer_client, approval)
    execution.execute_call(str(approval.call_id))

    call = ToolCall.objects.get(pk=approval.call_id)
    assert call.status == Status.COMPLETED and (workspace / "greeting.txt").exists()
    answer = api_call(agent, call.pk)
    assert answer["status"] == "completed"
    content = answer["content"]
    why = "Harness cannot watch everything the command's effect depends on outside the workspace"
    assert content == f"exit code 0\nsaid\n\n\n{NOTE}{why}{RAN}", content
    assert str(tmp_path) not in content  # no path outside the workspace reaches the model
    completed = AuditEvent.objects.get(subject=f"call:{call.pk}", kind="call.completed")
    assert completed.payload["content"] == content
    assert completed.payload["effect"] == {
        "outcome": "ran",
        "previewed": True,
        "not_appliable": "unwatched",
        "note": row.note,
        "command_digest": call.digest,
        "effect_digest": approval.effect_digest,
    }


def test_a_preview_that_needed_the_network_is_said_to_the_model(
    previews_on: None, agent: AgentFixture, reviewer_client: Client
) -> None:
    session_id = start_session(agent)
    code = (
        "import socket\ntry:\n socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
        "except OSError:\n print('offline')\n"
    )
    argv = ["python3", "-c", code]
    approval = ask(agent, {"argv": argv}, session_id=session_id, name="run_command")
    _approve(reviewer_client, approval)
    execution.execute_call(str(approval.call_id))

    content = api_call(agent, approval.call_id)["content"]
    why = "the command tried to reach the network, which a preview does not have"
    assert content.endswith(f"\n\n{NOTE}{why}{RAN}"), content
    assert content.count("\n[Note:") == 1
    completed = AuditEvent.objects.get(subject=f"call:{approval.call_id}", kind="call.completed")
    assert completed.payload["effect"]["not_appliable"] == "network"
    assert completed.payload["effect"]["previewed"] is True


def test_an_applied_preview_has_no_note(
    previews_on: None, agent: AgentFixture, reviewer_client: Client
) -> None:
    approval = _ask_script(agent)
    _approve(reviewer_client, approval)
    execution.execute_call(str(approval.call_id))

    content = api_call(agent, approval.call_id)["content"]
    assert content == "exit code 0\nbuilt\n", content
    completed = AuditEvent.objects.get(subject=f"call:{approval.call_id}", kind="call.completed")
    assert completed.payload["effect"]["outcome"] == "applied"
    assert "not_appliable" not in completed.payload["effect"]
