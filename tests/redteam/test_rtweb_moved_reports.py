"""Red team (rtweb): a client's report of a call released before its agent moved to
another team (dispatcher/gateways/hooks.py `_former_call`), for the clients besides Claude
Code (tests/redteam/test_rtxfer_client_report.py): Gemini CLI, which sends no tool ids
(the call is found by its tool and exact input), and Codex. The report goes to the former
team's call; nothing of it reaches the new team's session. Real HTTP (Django's client)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from audit.models import AuditEvent
from dispatcher import agents
from dispatcher.models import AgentSession, Status, ToolCall
from tests.support.factories import unique
from tests.teams.world import TeamWorld, make_team

pytestmark = pytest.mark.django_db


def _hook(world: TeamWorld, client: str, body: dict[str, Any]) -> Any:
    return Client().post(
        f"/api/v1/hooks/{client}?wait=0",
        body,
        content_type="application/json",
        headers=world.agent.headers,
    )


def _nothing_in_new_team(pay: TeamWorld, infra: TeamWorld, *marks: str) -> None:
    theirs = AgentSession.objects.filter(agent=pay.agent.agent, team=infra.team)
    events = AuditEvent.objects.filter(chain__in=[str(s.pk) for s in theirs])
    leaked = [e.kind for e in events if any(m in json.dumps(e.payload) for m in marks)]
    assert leaked == []
    assert not ToolCall.objects.filter(session__in=theirs).exists()


def test_a_gemini_report_without_ids_after_the_move_goes_to_its_own_call() -> None:
    pay, infra = make_team("pay"), make_team("infra")
    sid = unique("gm")
    tool = {"tool_name": "read_file", "tool_input": {"file_path": f"/work/p/{pay.secret}"}}
    base = {"session_id": sid, "cwd": "/work/p", **tool}
    before = _hook(pay, "gemini", {**base, "hook_event_name": "BeforeTool"})
    assert before.status_code == 200, before.content
    call = ToolCall.objects.get(session__external_id=sid)
    assert call.status == Status.RELEASED, (call.status, call.reason)
    assert agents.transfer_agent(agent=pay.agent.agent, team=infra.team, actor="test")
    report = {**base, "hook_event_name": "AfterTool", "tool_response": {"llmContent": "pay-out"}}
    assert _hook(pay, "gemini", report).status_code == 200
    call.refresh_from_db()
    assert call.status == Status.REPORTED and "pay-out" in call.content
    _nothing_in_new_team(pay, infra, "pay-out", pay.secret)


def test_a_codex_report_of_an_unreleased_call_after_the_move_stays_with_its_call() -> None:
    """Codex names its calls: a call that asked and was not released (no reviewer within
    the hook's wait), reported as run after the move, is an orphan on that call's card,
    in the former team's session; nothing of it in the new team's."""
    pay, infra = make_team("pay"), make_team("infra")
    sid, tid = unique("cx"), unique("t")
    base = {
        "session_id": sid,
        "cwd": "/work/p",
        "tool_name": "Bash",
        "tool_input": {"command": f"ls {pay.secret}"},
        "tool_use_id": tid,
    }
    assert _hook(pay, "codex", {**base, "hook_event_name": "PreToolUse"}).status_code == 200
    call = ToolCall.objects.get(tool_use_id=tid)
    assert call.status == Status.CANCELLED
    assert agents.transfer_agent(agent=pay.agent.agent, team=infra.team, actor="test")
    report = {**base, "hook_event_name": "PostToolUse", "tool_response": "pay-out"}
    assert _hook(pay, "codex", report).status_code == 200
    orphan = AuditEvent.objects.get(kind="client.report_orphaned")
    assert orphan.chain == str(call.session_id) and orphan.subject == f"call:{call.pk}"
    _nothing_in_new_team(pay, infra, "pay-out", pay.secret)
