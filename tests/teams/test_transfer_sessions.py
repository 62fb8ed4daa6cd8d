"""A session stays with the team it was started for (dispatcher.models.AgentSession.team):
an agent moved to another team (agents.transfer_agent) takes none of its record along.

Before, sessions and their calls followed the agent's team of now: after a move, the new
team's auditors read everything the agent had done for its former team (arguments, file
contents, results: the timeline, replay, transcript and exports), its reviewers were
offered the former team's waiting asks, and the former team lost sight of its own record.
Now the former team keeps reading it, the new team reads nothing of it, the calls still
waiting in it are cancelled or denied at the move, and the agent's next call starts a
session of its new team (docs/teams.md, "Moving an agent")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals.models import ApprovalRequest
from dispatcher import agents
from dispatcher.models import AgentSession, Status, ToolCall
from tests.approvals.conftest import run_async
from tests.audit.test_live_timeline import open_timeline
from tests.support.factories import make_user, submit_one, unique
from tests.support.live import LiveStack
from tests.teams.test_cross_team import body
from tests.teams.test_cross_team_sockets import ORIGIN, cookie
from tests.teams.world import TeamWorld, make_team

db = pytest.mark.django_db


def person(user: User) -> Client:
    """A signed-in browser whose POSTs must carry the CSRF token."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def csrf_post(client: Client, url: str, data: dict[str, str]) -> Any:
    client.get("/approvals/")  # (a page with a form: sets the CSRF cookie)
    token = client.cookies["csrftoken"].value
    return client.post(url, data, headers={"X-CSRFToken": token})


def reads(client: Client, session_id: str) -> dict[str, tuple[int, str]]:
    """Every auditor page and export of one session: status and text."""
    base = f"/audit/sessions/{session_id}/"
    got = {}
    for name, url in {
        "timeline": base,
        "replay": base + "replay/",
        "transcript": base + "transcript/",
        "jsonl": base + "export.jsonl",
        "csv": base + "export.csv",
    }.items():
        response = client.get(url)
        got[name] = (response.status_code, body(response))
    return got


def api(fx: Any, method: str, url: str, data: Any = None) -> Any:
    send = getattr(Client(), method)
    if data is None:
        return send(url, headers=fx.headers)
    return send(url, data=json.dumps(data), content_type="application/json", headers=fx.headers)


def moved(pay: TeamWorld, infra: TeamWorld) -> ToolCall:
    """pay's agent with a call queued beside its ask, then moved to infra. The queued call."""
    queued: ToolCall = submit_one(pay.session, "read_file", {"path": f"{pay.secret}.read"}, "r")
    assert queued.status == Status.QUEUED
    assert agents.transfer_agent(agent=pay.agent.agent, team=infra.team, actor="test")
    return queued


@db
def test_the_former_team_keeps_its_record_and_the_new_team_reads_none_of_it() -> None:
    pay, infra = make_team("pay"), make_team("infra")
    org = person(make_user(unique("org-auditor"), groups=("auditor",)))
    old = str(pay.session.pk)
    # The control: before the move, pay's auditor reads it and infra's does not.
    assert {s for s, _ in reads(person(pay.members["auditor"]), old).values()} == {200}
    moved(pay, infra)

    theirs = reads(person(infra.members["auditor"]), old)
    assert {s for s, _ in theirs.values()} == {404}, theirs  # before: 200 each, secret shown
    assert not any(pay.secret in text for _, text in theirs.values())
    listing = person(infra.members["auditor"]).get("/audit/sessions/")
    assert listing.status_code == 200 and old not in body(listing)
    exported = body(person(infra.members["auditor"]).get("/audit/export/?fmt=jsonl"))
    assert old not in exported and pay.secret not in exported
    # Its ask's page, for infra's reviewer: not found.
    assert (
        person(infra.members["reviewer"]).get(f"/approvals/{pay.approval.pk}/").status_code == 404
    )

    own = reads(person(pay.members["auditor"]), old)
    assert {s for s, _ in own.values()} == {200}, own  # before: 404 each
    assert pay.secret in own["timeline"][1] and pay.secret in own["jsonl"][1]
    assert old in body(person(pay.members["auditor"]).get("/audit/sessions/"))
    for session in (old, str(infra.session.pk)):
        assert {s for s, _ in reads(org, session).values()} == {200}, session


@db
def test_calls_waiting_at_the_move_end_and_the_next_call_starts_a_session_of_the_new_team() -> None:
    pay, infra = make_team("pay"), make_team("infra")
    queued = moved(pay, infra)
    asked = ToolCall.objects.get(pk=pay.approval.call_id)
    queued.refresh_from_db()
    assert asked.status == Status.CANCELLED and "moved from the team" in asked.reason
    assert queued.status == Status.DENIED and "moved from the team" in queued.content
    # Nobody decides the ask now: not infra's reviewer (nor any of pay's: it is cancelled).
    refused = csrf_post(
        person(infra.members["reviewer"]),
        f"/approvals/{pay.approval.pk}/decide",
        {"action": "approve", "digest": pay.approval.digest},
    )
    assert refused.status_code in (403, 404) and pay.secret not in body(refused)
    assert ToolCall.objects.get(pk=asked.pk).status == Status.CANCELLED

    fx, old = pay.agent, pay.session.pk
    late = api(fx, "post", f"/api/v1/sessions/{old}/calls", {"calls": [_write("late.txt")]})
    assert late.status_code == 404 and "team the agent has left" in late.json()["error"]["message"]
    assert api(fx, "get", f"/api/v1/sessions/{old}").status_code == 404
    assert api(fx, "get", f"/api/v1/calls/{asked.pk}").status_code == 404
    assert not ToolCall.objects.filter(session_id=old, tool_use_id="late").exists()

    started = api(fx, "post", "/api/v1/sessions", {"title": "after the move"})
    assert started.status_code == 201
    new = started.json()["id"]
    sent = api(fx, "post", f"/api/v1/sessions/{new}/calls", {"calls": [_write("new.txt")]})
    assert sent.status_code == 202, sent.content  # waiting for a reviewer
    assert AgentSession.objects.get(pk=new).team_id == infra.team.pk
    assert person(infra.members["auditor"]).get(f"/audit/sessions/{new}/").status_code == 200
    assert person(pay.members["auditor"]).get(f"/audit/sessions/{new}/").status_code == 404
    assert "new.txt" in body(person(infra.members["reviewer"]).get("/approvals/"))
    assert "new.txt" not in body(person(pay.members["reviewer"]).get("/approvals/"))


def _write(path: str) -> dict[str, Any]:
    tool_use = "late" if path == "late.txt" else path
    return {"id": tool_use, "name": "write_file", "arguments": {"path": path, "content": "x"}}


@db
def test_an_ask_admitted_into_the_former_teams_session_during_the_move_runs_for_no_one() -> None:
    """An admission that read the session just before the move committed stores its ask in
    the former team's session after it: that team's reviewers see it (their record), the
    new team's are refused, and an approval does not run it (agents.token_refusal)."""
    pay, infra = make_team("pay"), make_team("infra")
    stale = AgentSession.objects.select_related("agent__owner").get(pk=pay.session.pk)
    assert agents.transfer_agent(agent=pay.agent.agent, team=infra.team, actor="test")
    call = submit_one(stale, "write_file", {"path": "raced.txt", "content": "x"}, "raced")
    approval = ApprovalRequest.objects.get(call=call)
    form = {"action": "approve", "digest": approval.digest}
    url = f"/approvals/{approval.pk}/decide"
    refused = csrf_post(person(infra.members["reviewer"]), url, form)
    assert refused.status_code == 403 and "another team's agent" in body(refused)
    assert "raced.txt" in body(person(pay.members["reviewer"]).get("/approvals/"))
    assert "raced.txt" not in body(person(infra.members["reviewer"]).get("/approvals/"))
    csrf_post(person(pay.members["reviewer"]), url, form)
    call.refresh_from_db()
    assert call.status == Status.DENIED and "moved to another team" in call.content
    assert call.decided_by == "guard:team"  # not the token's guard: the token is valid


@db
def test_a_client_session_of_the_same_id_starts_again_for_the_new_team(settings: Any) -> None:
    """A hook client keeps its own session id across the move: its next call starts a
    Harness session of the new team under that id; the former one stays the former
    team's."""
    settings.HARNESS_HOOK_DEFAULT_WAIT = 0.2  # (each ask answered at once: 50 s each before)
    pay, infra = make_team("pay"), make_team("infra")
    sid = unique("cc")

    def hook(command: str) -> Any:
        return Client().post(
            "/api/v1/hooks/claude-code",
            {
                "session_id": sid,
                "hook_event_name": "PreToolUse",
                "cwd": "/work/project",
                "tool_name": "Bash",
                "tool_input": {"command": command},
                "tool_use_id": unique("t"),
            },
            content_type="application/json",
            headers=pay.agent.headers,
        )

    assert hook("ls before").status_code == 200
    assert agents.transfer_agent(agent=pay.agent.agent, team=infra.team, actor="test")
    assert hook("ls after").status_code == 200
    sessions = {
        s.team_id: s for s in AgentSession.objects.filter(agent=pay.agent.agent, external_id=sid)
    }
    assert set(sessions) == {pay.team.pk, infra.team.pk}
    before, after = sessions[pay.team.pk].pk, sessions[infra.team.pk].pk
    assert ToolCall.objects.get(session_id=after).arguments == {"command": "ls after"}
    assert person(pay.members["auditor"]).get(f"/audit/sessions/{before}/").status_code == 200
    assert person(pay.members["auditor"]).get(f"/audit/sessions/{after}/").status_code == 404
    assert person(infra.members["auditor"]).get(f"/audit/sessions/{before}/").status_code == 404
    assert person(infra.members["auditor"]).get(f"/audit/sessions/{after}/").status_code == 200


@pytest.mark.live
def test_the_timeline_socket_of_a_moved_agents_session_opens_for_its_former_team_only(
    live_stack: LiveStack, live_db: None
) -> None:
    pay, infra = make_team("pay"), make_team("infra")
    assert agents.transfer_agent(agent=pay.agent.agent, team=infra.team, actor="test")
    cookies = {
        "former": cookie(pay.members["auditor"]),
        "new": cookie(infra.members["auditor"]),
        "org": cookie(make_user(unique("org-auditor"), groups=("auditor",))),
    }

    async def connects(who: str) -> bool:
        socket, connected = await open_timeline(str(pay.session.pk), ORIGIN, cookies[who])
        if connected:
            assert 'id="audit-summary"' in await socket.receive_from(timeout=5)
        await socket.disconnect()
        return connected

    async def scenario() -> dict[str, bool]:
        return {who: await connects(who) for who in cookies}

    assert run_async(scenario) == {"former": True, "new": False, "org": True}


def _there_and_back(world: TeamWorld) -> None:
    """The world's agent moved to another team and back to its own."""
    away = make_team("away")
    assert agents.transfer_agent(agent=world.agent.agent, team=away.team, actor="test")
    assert agents.transfer_agent(agent=world.agent.agent, team=world.team, actor="test")


@db
def test_a_session_left_by_a_move_stays_closed_once_the_agent_is_back() -> None:
    """The sessions of a team an agent left took calls again once it was moved back (they
    are read by the agent's team of now), under the grants a reviewer gave "for this
    session" before the move: a write the grant allows was admitted and queued, unasked.
    A session left at a move is left for good (AgentSession.left_at); its grants with it."""
    pay = make_team("pay")
    fx, old = pay.agent, pay.session.pk
    granted = pay.grant.rule.removeprefix("write_file(").removesuffix(")")
    _there_and_back(pay)

    sent = api(fx, "post", f"/api/v1/sessions/{old}/calls", {"calls": [_write(granted)]})
    assert sent.status_code == 404, sent.content  # before: 200, queued under the grant
    assert "team the agent has left" in sent.json()["error"]["message"]
    assert api(fx, "get", f"/api/v1/sessions/{old}").status_code == 404
    assert not ToolCall.objects.filter(session_id=old, tool_use_id=granted).exists()
    assert AgentSession.objects.get(pk=old).left_at is not None
    # Its former team still reads its record.
    assert person(pay.members["auditor"]).get(f"/audit/sessions/{old}/").status_code == 200
    # A new session of the agent's team holds none of the old grants: the write asks.
    started = api(fx, "post", "/api/v1/sessions", {"title": "back again"})
    assert started.status_code == 201
    new = started.json()["id"]
    asked = api(fx, "post", f"/api/v1/sessions/{new}/calls", {"calls": [_write(granted)]})
    assert asked.status_code == 202, asked.content
    assert ToolCall.objects.get(session_id=new).status == Status.PENDING_APPROVAL


@db
def test_a_hook_or_mcp_session_left_by_a_move_is_not_joined_once_the_agent_is_back(
    settings: Any,
) -> None:
    """A hook client's session id and an MCP session id of a session left at a move name it
    no more once the agent is back: the hook's next call starts a new session of the team
    under the same id, and the MCP session id authenticates no session (404: initialize
    again), as it does while the agent is away."""
    from dispatcher.gateways import mcp_http

    settings.HARNESS_HOOK_DEFAULT_WAIT = 0.2  # (each ask answered at once: 50 s each before)
    pay = make_team("pay")
    fx, sid = pay.agent, unique("cc")

    def hook(command: str) -> Any:
        return Client().post(
            "/api/v1/hooks/claude-code",
            {
                "session_id": sid,
                "hook_event_name": "PreToolUse",
                "cwd": "/work/project",
                "tool_name": "Bash",
                "tool_input": {"command": command},
                "tool_use_id": unique("t"),
            },
            content_type="application/json",
            headers=fx.headers,
        )

    assert hook("ls before").status_code == 200
    [before] = AgentSession.objects.filter(agent=fx.agent, external_id=sid)
    mcp = agents.start_session(agent=fx.agent, client="mcp", external_id=unique("mcp"))
    assert mcp_http.authenticate(fx.token, mcp.external_id)[1] == mcp  # (the control)
    _there_and_back(pay)

    assert hook("ls after").status_code == 200
    after = AgentSession.objects.exclude(pk=before.pk).get(agent=fx.agent, external_id=sid)
    assert after.team_id == before.team_id == pay.team.pk and after.left_at is None
    assert ToolCall.objects.get(session=after).arguments == {"command": "ls after"}
    assert ToolCall.objects.filter(session=before).count() == 1  # before: both joined it
    agent, session = mcp_http.authenticate(fx.token, mcp.external_id)
    assert agent == fx.agent and session is None  # before: the left session


@db
def test_an_ask_admitted_into_a_left_session_runs_for_no_one_once_the_agent_is_back() -> None:
    """An admission that read the session before the move stores its ask there after it;
    the agent is moved back before a reviewer approves it: the session is still left, so
    the approval does not run it (agents.token_refusal)."""
    pay = make_team("pay")
    stale = AgentSession.objects.select_related("agent__owner").get(pk=pay.session.pk)
    _there_and_back(pay)
    call = submit_one(stale, "write_file", {"path": "raced.txt", "content": "x"}, "raced")
    approval = ApprovalRequest.objects.get(call=call)
    form = {"action": "approve", "digest": approval.digest}
    csrf_post(person(pay.members["reviewer"]), f"/approvals/{approval.pk}/decide", form)
    call.refresh_from_db()
    assert call.status == Status.DENIED and "moved to another team" in call.content
    assert call.decided_by == "guard:team"
