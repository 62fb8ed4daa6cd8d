"""Red-team sweep of the human surfaces (team boundary, roles, hygiene): what a signed-in
person of one team can reach, and what bad input does to the pages. Each test is a
defect found by the sweep, reproduced with real requests."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.test import Client

from approvals import links
from audit.models import AuditEvent
from dispatcher import agents
from teams.services import remove_member
from tests.approvals.conftest import closing_connections, open_socket, run_async
from tests.audit.test_live_timeline import open_timeline
from tests.support.factories import submit_one
from tests.support.live import LiveStack
from tests.teams.test_cross_team_sockets import ORIGIN, cookie, heard
from tests.teams.world import TeamWorld, make_team, org_client, unchanged

db = pytest.mark.django_db


@pytest.fixture
def pay() -> TeamWorld:
    return make_team("pay")


def quiet(client: Client) -> Client:
    client.raise_request_exception = False  # a 500 is an answer here, not an exception
    return client


# --- No 500 on bad input ----------------------------------------------------------------


@db
def test_a_nul_character_in_a_form_field_or_the_path_is_a_400_never_a_500(
    pay: TeamWorld,
) -> None:
    """PostgreSQL keeps no NUL in text: every page that looked up or stored a form field
    holding one (a username, a feedback, a channel's or an agent's name, a rule, a
    server's name in the path) answered 500 with a DataError."""
    digest = pay.approval.digest
    token = links.make_token(pay.approval, pay.members["reviewer"], "deny")
    team = f"/teams/{pay.team.pk}/members"
    owner = pay.agent.owner
    cases = [
        (
            "reviewer",
            f"/approvals/{pay.approval.pk}/decide",
            {"action": "deny", "digest": digest, "feedback": "no\x00"},
        ),
        (
            "reviewer",
            f"/approvals/{pay.approval.pk}/edit",
            {
                "digest": digest,
                "feedback": "x\x00",
                "arguments": '{"path": "b.txt", "content": "z"}',
            },
        ),
        ("reviewer", f"/approvals/{pay.approval.pk}/edit", {"digest": digest, "content": "a\x00b"}),
        ("reviewer", f"/approvals/links/{token}/", {"digest": digest, "feedback": "no\x00"}),
        ("admin", f"{team}/add", {"user": "a\x00b", "role": "reviewer"}),
        ("admin", f"{team}/remove", {"user": "a\x00b", "role": "reviewer"}),
        ("admin", "/agents/", {"name": "a\x00b", "owner": owner.username, "team": pay.team.name}),
        (
            "admin",
            f"/permissions/users/{owner.pk}/",
            {
                "mode": "standard",
                "allow": "read_file(a\x00)",
                "ask": "",
                "deny": "",
                "version": "1",
            },
        ),
        ("admin", "/tools/servers/a%00b/refresh", {}),
        (
            "org-admin",
            "/approvals/notifications/",
            {"name": "a\x00b", "kind": "webhook", "url": "https://hooks.example.com/"},
        ),
    ]
    answers = []
    for role, url, form in cases:
        client = quiet(org_client("admin") if role == "org-admin" else pay.client(role))
        answers.append((url.split("/")[1], role, client.post(url, form).status_code))
    assert [a for a in answers if a[2] >= 500] == []
    assert unchanged(pay) == []
    # The refusal reads the form after keeping the raw body: a page that reads the body
    # itself (JSON) still can, whatever the form's encoding.
    reviewer = quiet(pay.client("reviewer"))
    assert reviewer.post("/approvals/push/subscribe", {"endpoint": "x"}).status_code == 400


@db
def test_an_edit_the_database_cannot_store_is_a_400(pay: TeamWorld) -> None:
    """The edit form's JSON was read with json.loads: NaN, Infinity, a \\u0000 or a lone
    surrogate passed and failed in the database (500); the agent API refuses them."""
    client = quiet(pay.client("reviewer"))
    for text in (
        '{"path": "a\\u0000b.txt", "content": "z"}',
        '{"path": "\\ud800.txt", "content": "z"}',
        '{"path": "a.txt", "content": NaN}',
        '{"path": "a.txt", "content": 1e999}',
    ):
        answer = client.post(
            f"/approvals/{pay.approval.pk}/edit",
            {"digest": pay.approval.digest, "arguments": text},
        )
        assert answer.status_code == 400, text
    assert unchanged(pay) == []


@db
def test_session_filters_that_no_session_can_match_are_no_500(pay: TeamWorld) -> None:
    """A NUL in the list's agent, owner or tool filter, or a call id with one on the
    timeline, reached PostgreSQL (500); `until` the last day there is overflowed (500)."""
    auditor = quiet(pay.client("auditor"))
    for query in ({"tool": "a\x00"}, {"agent": "a\x00"}, {"user": "a\x00"}):
        answer = auditor.get("/audit/sessions/", query)
        assert answer.status_code == 200 and str(pay.session.pk) not in answer.content.decode()
    answer = auditor.get(f"/audit/sessions/{pay.session.pk}/", {"call": "a\x00b"})
    assert answer.status_code == 404
    for url in ("/audit/sessions/", "/audit/export/"):
        answer = auditor.get(url, {"until": "9999-12-31"})
        assert answer.status_code == 200, url
    listed = auditor.get("/audit/sessions/", {"until": "9999-12-31"}).content.decode()
    assert str(pay.session.pk) in listed
    assert not AuditEvent.objects.filter(kind__startswith="approval.").exists()


@db
def test_a_push_subscription_the_database_cannot_store_is_a_400(pay: TeamWorld) -> None:
    """Any reviewer's browser subscription: an endpoint longer than its column, or keys
    holding a \u0000 or a lone surrogate, answered 500; keys of any size and text were
    stored. A browser's keys are base64url."""
    import json

    reviewer = quiet(pay.client("reviewer"))
    endpoint = "https://push.example.com/p"
    good = {"p256dh": "B" * 87, "auth": "a_b-c" * 4 + "AA"}
    bodies = [
        json.dumps({"endpoint": endpoint + "a" * 1500, "keys": good}),
        json.dumps({"endpoint": endpoint, "keys": {**good, "p256dh": "a\u0000"}}),
        '{"endpoint": "' + endpoint + '", "keys": {"p256dh": "\\ud800", "auth": "b"}}',
        json.dumps({"endpoint": endpoint, "keys": {**good, "auth": "x" * 200_000}}),
        json.dumps({"endpoint": endpoint, "keys": {**good, "auth": "<script>"}}),
    ]
    for body in bodies:
        answer = reviewer.post("/approvals/push/subscribe", body, "application/json")
        assert answer.status_code == 400, body[:80]
    body = json.dumps({"endpoint": endpoint, "keys": good})
    assert reviewer.post("/approvals/push/subscribe", body, "application/json").status_code == 201


# --- Escalation survives an edit --------------------------------------------------------


@db
def test_an_edit_of_an_escalated_ask_stays_with_the_tier_it_was_escalated_to() -> None:
    """The next tier's reviewer may edit an escalated ask, and the edit is their approval
    of the new call: but the new call was not escalated, so their vote was discarded at
    once as of "no longer a reviewer of the agent's team" (audited so), they could neither
    see nor decide the call they wrote, and the ask went back to the team that had let it
    wait past its delay."""
    from datetime import timedelta

    from approvals import services
    from approvals.models import ApprovalRequest
    from dispatcher.policy import profiles
    from teams.services import set_escalation

    pay, sec, third = make_team("pay"), make_team("sec"), make_team("third")
    profiles.update_profile(
        user=pay.agent.owner,
        mode="standard",
        allow=[],
        ask=[{"rule": "write_file(*)", "approvals": 2}],
        deny=[],
        actor="test",
    )
    set_escalation(team=pay.team, after=30, to=sec.team, actor="test")
    created = ApprovalRequest.objects.get(pk=pay.approval.pk).created_at
    assert services.escalate_due(created + timedelta(seconds=31)) == [pay.approval.pk]
    editor = sec.client("reviewer")
    answer = editor.post(
        f"/approvals/{pay.approval.pk}/edit",
        {"digest": pay.approval.digest, "arguments": '{"path": "other.txt", "content": "y"}'},
    )
    assert answer.status_code == 302
    new = ApprovalRequest.objects.get(call__edited_from=pay.approval.call_id)
    assert new.escalated_to_id == sec.team.pk
    assert list(new.votes.values_list("voter", flat=True)) == [sec.members["reviewer"].pk]
    assert not AuditEvent.objects.filter(kind="approval.vote_discarded").exists()
    assert sec.secret not in editor.get(f"/approvals/{new.pk}/").content.decode()
    assert editor.get(f"/approvals/{new.pk}/").status_code == 200
    assert "other.txt" in editor.get("/approvals/").content.decode()
    # A third team still sees nothing of it; the owning team's reviewer completes it.
    assert third.client("reviewer").get(f"/approvals/{new.pk}/").status_code == 404
    done = pay.client("reviewer").post(
        f"/approvals/{new.pk}/decide", {"action": "approve", "digest": new.digest}
    )
    assert done.status_code == 302
    new.call.refresh_from_db()
    assert new.call.status == "queued"
    # Escalated once: the new call is not escalated again later.
    assert services.escalate_due(created + timedelta(seconds=62)) == []


# --- Sockets follow the session's team --------------------------------------------------


@pytest.mark.live
def test_a_timeline_socket_stops_when_its_auditor_leaves_the_sessions_team(
    live_stack: LiveStack, live_db: None
) -> None:
    """An auditor's open timeline socket of a session is the session's team's: it keeps
    hearing the session when its agent moves to another team (the session stays its
    team's record, AgentSession.team; before, it went on carrying the session to nobody's
    team's auditor once the agent's team changed, and the fix closed it) and closes when
    the auditor leaves that team. Push-only: what the browser sends changes nothing; the
    queue socket of a reviewer who leaves the team closes at once."""
    pay, infra = make_team("pay"), make_team("infra")
    reviewer, auditor = cookie(pay.members["reviewer"]), cookie(pay.members["auditor"])
    got: dict[str, Any] = {}

    def move() -> None:  # cancels the session's waiting ask: a change of the session
        agents.transfer_agent(agent=pay.agent.agent, actor="test", team=infra.team)

    def leave(role: str) -> None:
        remove_member(team=pay.team, user=pay.members[role], role=role, actor="t")

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        queue, opened = await open_socket(ORIGIN, reviewer)
        assert opened and pay.secret in await queue.receive_from(timeout=5)
        timeline, opened = await open_timeline(str(pay.session.pk), ORIGIN, auditor)
        assert opened and "audit-summary" in await timeline.receive_from(timeout=5)
        for text in ('{"type": "queue.push", "html": "<b>x</b>"}', '{"type": "sockets.close"}'):
            await queue.send_to(text_data=text)
            await timeline.send_to(text_data=text)
        got["queue heard"] = await heard(queue, 1)
        got["timeline heard"] = await heard(timeline, 1)
        await loop.run_in_executor(None, closing_connections(move))
        got["timeline after move"] = await timeline.receive_output(timeout=5)
        await loop.run_in_executor(None, closing_connections(lambda: leave("auditor")))
        got["timeline after leaving"] = await timeline.receive_output(timeout=5)
        await loop.run_in_executor(None, closing_connections(lambda: leave("reviewer")))
        while (message := await queue.receive_output(timeout=5))["type"] == "websocket.send":
            pass  # (the moved ask's removal)
        got["queue after leaving"] = message

    run_async(scenario)
    assert got["queue heard"] == [] and got["timeline heard"] == []
    after_move = got["timeline after move"]
    assert after_move["type"] == "websocket.send" and "audit-summary" in after_move["text"]
    assert got["timeline after leaving"] == {"type": "websocket.close", "code": 4403}
    assert got["queue after leaving"] == {"type": "websocket.close", "code": 4403}


@db
def test_the_tier_an_ask_escalated_to_decides_it_but_grants_nothing_for_its_session() -> None:
    """Escalation widens a reviewer's reach over one ask only (docs/teams.md); "Approve
    for this session" by the next tier's reviewer granted a rule over the agent's session,
    so later asks of the other team's agent were allowed without being offered to anyone."""
    from datetime import timedelta

    from approvals import services
    from approvals.models import ApprovalRequest
    from dispatcher.policy.models import SessionGrant
    from teams.services import set_escalation

    pay, sec = make_team("pay"), make_team("sec")
    set_escalation(team=pay.team, after=30, to=sec.team, actor="test")
    created = ApprovalRequest.objects.get(pk=pay.approval.pk).created_at
    services.escalate_due(created + timedelta(seconds=31))
    grants = SessionGrant.objects.filter(session=pay.session).count()
    url = f"/approvals/{pay.approval.pk}/decide"
    form = {"action": "approve_session", "digest": pay.approval.digest}
    refused = sec.client("reviewer").post(url, form)
    assert refused.status_code == 403 and "escalated to your team" in refused.content.decode()
    assert SessionGrant.objects.filter(session=pay.session).count() == grants
    assert unchanged(pay) == []
    # They approve the ask itself; the agent's own team may still allow it for the session.
    approved = sec.client("reviewer").post(url, {**form, "action": "approve"})
    assert approved.status_code == 302
    assert SessionGrant.objects.filter(session=pay.session).count() == grants


@db
def test_pages_that_show_agents_calls_are_kept_in_no_browser_cache(pay: TeamWorld) -> None:
    """The queue, a call's page, the timeline, an export and a one-tap link's page (an
    agent's arguments, whole) came without Cache-Control: the browser kept them in its
    disk cache and showed them again on "back" after sign-out (docs/dashboard.md: no agent
    data is kept in the browser)."""
    token = links.make_token(pay.approval, pay.members["reviewer"], "approve")
    session = pay.session.pk
    pages = {
        "reviewer": [
            "/",
            "/approvals/",
            f"/approvals/{pay.approval.pk}/",
            f"/approvals/links/{token}/",
        ],
        "auditor": [f"/audit/sessions/{session}/", f"/audit/sessions/{session}/export.jsonl"],
        "admin": ["/permissions/", f"/teams/{pay.team.pk}/"],
    }
    for role, urls in pages.items():
        client = pay.client(role)
        for url in urls:
            answer = client.get(url)
            assert answer.status_code == 200, url
            assert "no-store" in answer.get("Cache-Control", ""), url


@db
def test_editing_another_teams_call_is_refused_saying_why_as_deciding_it_is() -> None:
    """docs/teams.md: deciding *or editing* another team's call answers 403 with the
    reason; the edit page answered 404 (the decision 403)."""
    pay, infra = make_team("pay"), make_team("infra")
    answer = infra.client("reviewer").post(
        f"/approvals/{pay.approval.pk}/edit",
        {"digest": pay.approval.digest, "arguments": '{"path": "b.txt", "content": "z"}'},
    )
    assert answer.status_code == 403 and "another team's agent" in answer.content.decode()
    assert not any(marker in answer.content.decode() for marker in pay.markers)
    assert unchanged(pay) == []
    missing = infra.client("reviewer").post("/approvals/987654321/edit", {"digest": "x"})
    assert missing.status_code == 404


@db
def test_a_vote_of_someone_who_left_the_team_holds_no_groups_count() -> None:
    """A several-groups quorum ("1 of oncall and 1 of security"): a reviewer who voted
    for oncall and then left the team still held oncall's count when the next oncall
    reviewer of the team approved, who was refused (409, "your groups already have the
    approvals they need"); the departed vote was discarded only when some other vote
    was recorded."""
    from django.contrib.auth.models import Group

    from approvals.models import ApprovalRequest
    from dispatcher.policy import profiles
    from teams.services import add_member
    from tests.support.factories import make_user, unique

    pay = make_team("pay")
    oncall, _ = Group.objects.get_or_create(name="oncall")
    Group.objects.get_or_create(name="security")
    counts = [{"group": "oncall", "count": 1}, {"group": "security", "count": 1}]
    profiles.update_profile(
        user=pay.agent.owner,
        mode="standard",
        allow=[],
        ask=[{"rule": "write_file", "approvals": counts}],
        deny=[],
        actor="test",
    )
    call = submit_one(pay.session, "write_file", {"path": "q.txt", "content": "x"}, "q")
    approval = ApprovalRequest.objects.get(call=call)
    leaver, stayer = make_user(unique("leaver")), make_user(unique("stayer"))
    for person in (leaver, stayer):
        add_member(team=pay.team, user=person, role="reviewer", actor="test")
        person.groups.add(oncall)

    def approve(person: object) -> int:
        client = Client()
        client.force_login(person)  # type: ignore[arg-type]
        form = {"action": "approve", "digest": approval.digest}
        return client.post(f"/approvals/{approval.pk}/decide", form).status_code

    assert approve(leaver) == 302
    remove_member(team=pay.team, user=leaver, role="reviewer", actor="test")
    assert approve(stayer) == 302
    assert list(approval.votes.values_list("voter", flat=True)) == [stayer.pk]
    discarded = AuditEvent.objects.get(kind="approval.vote_discarded")
    assert discarded.payload["reviewer"] == leaver.username


@db
def test_a_team_members_overview_counts_no_other_teams_sessions(
    pay: TeamWorld, settings: Any, tmp_path: Any
) -> None:
    """The overview shows the figures of the person's teams; the checkpoint row said how
    many chain heads (sessions, of every team) the last run signed."""
    import io

    from django.core.management import call_command

    infra = make_team("infra")
    settings.HARNESS_CHECKPOINT_PATH = str(tmp_path / "checkpoints.jsonl")
    settings.HARNESS_CHECKPOINT_URL = ""
    call_command("audit_checkpoint", stdout=io.StringIO())
    for role in ("reviewer", "auditor", "admin"):
        page = pay.client(role).get("/").content.decode()
        assert "last run succeeded" in page and "heads signed" not in page, role
        assert not any(marker in page for marker in infra.markers), role
    assert "heads signed" in org_client("auditor").get("/").content.decode()


@db
def test_the_replay_transcript_and_session_list_show_invisible_characters_escaped() -> None:
    """The timeline shows an agent's text with its invisible and bidi characters escaped
    (`visible`); the replay, the transcript and the session list showed the session's
    title, the arguments, the tool's answer and the tool_use_id raw, so an agent could
    hide or reorder what an auditor reads there (a right-to-left override); so did the
    agent's page its sessions' titles. (The permissions pages, dispatcher/policy's
    templates, still show a session's title raw: not in this sweep's reach.)"""
    from dispatcher import agents as agent_service

    pay = make_team("pay")
    hidden = "rm\u202e-rf\u200b"
    session = agent_service.start_session(agent=pay.agent.agent, title=f"t{hidden}")
    submit_one(session, "write_file", {"path": f"{hidden}.txt", "content": hidden}, f"id{hidden}")
    auditor = pay.client("auditor")
    for url in (
        f"/audit/sessions/{session.pk}/",
        f"/audit/sessions/{session.pk}/replay/",
        f"/audit/sessions/{session.pk}/transcript/",
        "/audit/sessions/",
        f"/agents/{pay.agent.agent.pk}/",
    ):
        client = pay.client("admin") if url.startswith("/agents/") else auditor
        page = client.get(url).content.decode()
        assert "\u202e" not in page and "\u200b" not in page, url
        assert "\\u202e" in page, url


@db
def test_the_permissions_pages_show_a_sessions_title_escaped() -> None:
    from dispatcher import agents as agent_service
    from dispatcher.policy.models import SessionGrant

    pay = make_team("pay")
    session = agent_service.start_session(agent=pay.agent.agent, title="t\u202eev")
    SessionGrant.objects.create(session=session, rule="write_file(x.txt)", tool="write_file")
    admin = pay.client("admin")
    for url in ("/permissions/", f"/permissions/sessions/{session.pk}/"):
        page = admin.get(url).content.decode()
        assert "\u202e" not in page, url


@db
def test_the_passkeys_page_answers_every_signed_in_person() -> None:
    """GET /accounts/2fa/webauthn/ (the list of one's passkeys) is a 500 for anyone
    signed in: TemplateSyntaxError, 'humanize' is not a registered tag library."""
    from tests.support.factories import make_user, unique

    client = quiet(Client())
    client.force_login(make_user(unique("person"), groups=("reviewer",)))
    assert client.get("/accounts/2fa/webauthn/").status_code < 500


@db
def test_applying_a_suggestion_for_a_user_that_is_not_a_number_is_no_500(
    pay: TeamWorld,
) -> None:
    admin = quiet(pay.client("admin"))
    form = {"user": "b", "rule": "write_file(x.txt)", "action": "allow", "version": "1"}
    assert admin.post("/permissions/analytics/apply", form).status_code < 500


@pytest.mark.live
def test_a_real_daphne_refuses_a_nul_in_a_form_and_keeps_the_json_body(
    live_stack: LiveStack, live_db: None
) -> None:
    """The refusal of NUL characters and the no-store pages, through daphne's ASGI
    request (its body read from a spooled file, not the test client's)."""
    import httpx
    from django.conf import settings

    pay = make_team("pay")
    client = Client()
    client.force_login(pay.members["reviewer"])
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    with httpx.Client(base_url=live_stack.url, timeout=30) as web:
        web.cookies.set(settings.SESSION_COOKIE_NAME, session)
        queue = web.get("/approvals/")
        assert queue.status_code == 200 and "no-store" in queue.headers["cache-control"]
        token = web.cookies[settings.CSRF_COOKIE_NAME]
        headers = {"X-CSRFToken": token, "Origin": live_stack.url, "Referer": live_stack.url + "/"}
        form = {"action": "deny", "digest": pay.approval.digest, "feedback": "no\x00"}
        refused = web.post(f"/approvals/{pay.approval.pk}/decide", data=form, headers=headers)
        assert refused.status_code == 400 and "NUL" in refused.text
        subscription = {
            "endpoint": "https://push.example.com/p",
            "keys": {"p256dh": "B" * 87, "auth": "A" * 22},
        }
        stored = web.post("/approvals/push/subscribe", json=subscription, headers=headers)
        assert stored.status_code == 201
    assert unchanged(pay) == []
