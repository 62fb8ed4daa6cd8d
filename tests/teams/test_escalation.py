"""Routing and escalation: an ask no one decided within its team's delay is offered to the
next tier too (another team, or the organization's reviewers): in their queue, on their
sockets, by their notifications, and they may decide it; audited. A controllable clock:
the escalation is given its `now`, as the expiry is. And separation of duties covers the
agent's owner, its sponsor and the person whose sign-in started its sessions."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from channels.layers import get_channel_layer
from django.contrib.auth.models import User
from django.core import mail
from django.core.management import CommandError, call_command
from django.test import Client

from approvals import asks, live, services
from approvals.models import ApprovalRequest
from approvals.notifications import services as notifications
from approvals.notifications.models import Channel, Delivery, Kind
from audit.models import AuditEvent
from dispatcher import agents
from dispatcher.models import Status
from teams.models import Team
from teams.services import TeamError, set_escalation
from tests.support.factories import make_user, unique
from tests.teams.world import TeamWorld, make_team, org_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def teams() -> tuple[TeamWorld, TeamWorld]:
    return make_team("pay"), make_team("sec")


def decide(client: Client, approval: ApprovalRequest, action: str = "approve") -> Any:
    return client.post(
        f"/approvals/{approval.pk}/decide", {"action": action, "digest": approval.digest}
    )


def status_of(approval: ApprovalRequest) -> str:
    approval.call.refresh_from_db()
    return str(approval.call.status)


def created(world: TeamWorld) -> Any:
    return ApprovalRequest.objects.get(pk=world.approval.pk).created_at


# --- Setting it -------------------------------------------------------------------------


def test_the_command_sets_it_the_page_shows_it_and_it_is_audited(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    pay, sec = teams
    out = StringIO()
    call_command(
        "set_escalation", pay.team.name, "--after", "300", "--to", sec.team.name, stdout=out
    )
    assert (
        f"After 300 s without a decision, an ask is offered to the team {sec.team.name}"
        in out.getvalue()
    )
    team = Team.objects.get(pk=pay.team.pk)
    assert (team.escalation_after, team.escalate_to_id) == (300, sec.team.pk)
    event = AuditEvent.objects.get(kind="team.escalation_set", subject=f"team:{pay.team.pk}")
    assert event.payload["after"] == 300 and event.payload["to"] == sec.team.name
    page = pay.client("admin").get(f"/teams/{pay.team.pk}/").content.decode()
    assert "After 300 s without a decision" in page and sec.team.name in page
    call_command("set_escalation", pay.team.name, "--after", "60", stdout=StringIO())
    page = pay.client("admin").get(f"/teams/{pay.team.pk}/").content.decode()
    assert "offered to the organization&#x27;s reviewers too" in page
    call_command("set_escalation", pay.team.name, "--off", stdout=StringIO())
    assert Team.objects.get(pk=pay.team.pk).escalation_after is None
    assert AuditEvent.objects.filter(kind="team.escalation_set").count() == 3


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        (["--after", "0"], "from 1 to"),
        (["--after", "60", "--to", "SELF"], "cannot escalate to itself"),
        (["--after", "60", "--to", "no-such-team"], "No team named 'no-such-team'"),
        (["--off", "--to", "OTHER"], "with --off nothing escalates"),
    ],
)
def test_bad_settings_are_named_and_change_nothing(
    teams: tuple[TeamWorld, TeamWorld], arguments: list[str], problem: str
) -> None:
    pay, sec = teams
    arguments = [{"SELF": pay.team.name, "OTHER": sec.team.name}.get(a, a) for a in arguments]
    with pytest.raises(CommandError, match=problem):
        call_command("set_escalation", pay.team.name, *arguments, stdout=StringIO())
    assert Team.objects.get(pk=pay.team.pk).escalation_after is None
    assert not AuditEvent.objects.filter(kind="team.escalation_set").exists()


# --- Escalating -------------------------------------------------------------------------


def test_an_undecided_ask_is_offered_to_the_next_team_when_its_delay_passes(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    pay, sec = teams
    set_escalation(team=pay.team, after=60, to=sec.team, actor="test")
    approval = pay.approval
    sec_reviewer = sec.client("reviewer")
    # Before the delay: nothing escalates, the other team sees and decides nothing.
    assert services.escalate_due(created(pay) + timedelta(seconds=59)) == []
    assert pay.secret not in sec_reviewer.get("/approvals/").content.decode()
    assert sec_reviewer.get(f"/approvals/{approval.pk}/").status_code == 404
    assert decide(sec_reviewer, approval).status_code == 403
    assert not AuditEvent.objects.filter(kind="approval.escalated").exists()

    at = created(pay) + timedelta(seconds=60)
    assert services.escalate_due(at) == [approval.pk]
    row = ApprovalRequest.objects.get(pk=approval.pk)
    assert (row.escalated_at, row.escalated_to_id) == (at, sec.team.pk)
    event = AuditEvent.objects.get(kind="approval.escalated", subject=f"call:{approval.call_id}")
    assert event.actor == "harness"
    assert event.payload["team"] == pay.team.name and event.payload["to"] == sec.team.name
    assert event.payload["after_seconds"] == 60 and event.payload["waited_seconds"] == 60
    # Once per ask.
    assert services.escalate_due(at + timedelta(hours=1)) == []
    # The next tier sees it in its queue (marked), opens it, and may decide it.
    queue = sec_reviewer.get("/approvals/").content.decode()
    assert pay.secret in queue and "Escalated" in queue
    assert sec_reviewer.get(f"/approvals/{approval.pk}/").status_code == 200
    # The next tier's auditor and admin gain nothing: escalation is a reviewer's reach.
    assert sec.client("auditor").get(f"/audit/sessions/{pay.session.pk}/").status_code in (403, 404)
    assert decide(sec_reviewer, approval).status_code == 302
    assert status_of(approval) == Status.QUEUED
    approved = AuditEvent.objects.get(kind="call.approved", subject=f"call:{approval.call_id}")
    assert approved.actor == f"user:{sec.members['reviewer'].username}"


def test_a_third_team_still_sees_nothing_of_an_escalated_ask(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    pay, sec = teams
    other = make_team("ops")
    set_escalation(team=pay.team, after=1, to=sec.team, actor="test")
    services.escalate_due(created(pay) + timedelta(seconds=5))
    client = other.client("reviewer")
    assert pay.secret not in client.get("/approvals/").content.decode()
    assert client.get(f"/approvals/{pay.approval.pk}/").status_code == 404
    assert decide(client, pay.approval).status_code == 403
    assert status_of(pay.approval) == Status.PENDING_APPROVAL


def test_escalation_to_the_organization_names_no_team_and_tells_its_reviewers(
    teams: tuple[TeamWorld, TeamWorld], settings: Any
) -> None:
    pay, sec = teams
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    org = org_client("reviewer")
    org_user = User.objects.get(pk=org.session["_auth_user_id"])
    org_user.email = "org@example.com"
    org_user.save()
    for world in (pay, sec):
        for user in world.members.values():
            user.email = f"{user.username}@example.com"
            user.save()
    Channel.objects.create(name="mail", kind=Kind.EMAIL, config={"addresses": []})
    set_escalation(team=pay.team, after=30, to=None, actor="test")
    assert services.escalate_due(created(pay) + timedelta(seconds=31)) == [pay.approval.pk]
    row = ApprovalRequest.objects.get(pk=pay.approval.pk)
    assert row.escalated_at is not None and row.escalated_to_id is None
    event = AuditEvent.objects.get(kind="approval.escalated")
    assert event.payload["to"] == "organization reviewers"
    planned = notifications.plan_ask(pay.approval.pk, event=Delivery.Event.ESCALATED)
    for delivery_id in planned:
        notifications.deliver(delivery_id)
    assert {a for m in mail.outbox for a in m.to} == {"org@example.com"}
    assert pay.secret not in sec.client("reviewer").get("/approvals/").content.decode()


def test_the_next_team_is_notified_through_the_channels_and_its_links_decide(
    teams: tuple[TeamWorld, TeamWorld], settings: Any
) -> None:
    pay, sec = teams
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    for world in (pay, sec):
        for user in world.members.values():
            user.email = f"{user.username}@example.com"
            user.save()
    Channel.objects.create(name="mail", kind=Kind.EMAIL, config={"addresses": []})
    set_escalation(team=pay.team, after=30, to=sec.team, actor="test")
    services.escalate_due(created(pay) + timedelta(seconds=31))
    planned = notifications.plan_ask(pay.approval.pk, event=Delivery.Event.ESCALATED)
    assert Delivery.objects.filter(pk__in=planned, event="escalated").count() == len(planned) == 1
    for delivery_id in planned:
        notifications.deliver(delivery_id)
    [message] = mail.outbox
    assert message.to == [sec.members["reviewer"].email]
    # The one-tap link in it is the next tier's reviewer's: it shows the call and decides.
    line = next(x for x in message.body.splitlines() if x.startswith("Approve: "))
    path = line[line.index("/approvals/links/") :].strip()
    client = sec.client("reviewer")  # (links ask their recipient to be signed in)
    page = client.get(path)
    assert page.status_code == 200 and pay.secret in page.content.decode()
    done = client.post(path, {"digest": pay.approval.digest})
    assert done.status_code == 200 and "Approved" in done.content.decode()
    assert status_of(pay.approval) == Status.QUEUED


def test_the_periodic_escalation_enqueues_the_notification(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    pay, sec = teams
    set_escalation(team=pay.team, after=30, to=sec.team, actor="test")
    assert asks.escalate_due(created(pay) + timedelta(seconds=31)) == 1
    assert asks.escalate_due(created(pay) + timedelta(seconds=62)) == 0


def test_an_ask_past_its_expiry_is_left_to_the_expiry(teams: tuple[TeamWorld, TeamWorld]) -> None:
    pay, sec = teams
    set_escalation(team=pay.team, after=30, to=sec.team, actor="test")
    expires = ApprovalRequest.objects.get(pk=pay.approval.pk).expires_at
    assert services.escalate_due(expires + timedelta(seconds=1)) == []
    assert not AuditEvent.objects.filter(kind="approval.escalated").exists()


def test_a_decided_ask_never_escalates(teams: tuple[TeamWorld, TeamWorld]) -> None:
    pay, sec = teams
    set_escalation(team=pay.team, after=30, to=sec.team, actor="test")
    assert decide(pay.client("reviewer"), pay.approval, "deny").status_code == 302
    assert services.escalate_due(created(pay) + timedelta(seconds=31)) == []


@pytest.mark.django_db(transaction=True)  # the pushes read from another thread
def test_the_next_teams_sockets_get_the_escalated_ask_and_its_removal(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    from channels.db import database_sync_to_async

    from tests.approvals.conftest import run_async

    pay, sec = teams
    set_escalation(team=pay.team, after=30, to=sec.team, actor="test")
    services.escalate_due(created(pay) + timedelta(seconds=31))
    call_id = str(pay.approval.call_id)
    teams_seen = notifications.enqueue_outcome(call_id)
    assert teams_seen == (pay.team.pk, sec.team.pk)

    async def listen() -> list[str]:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(live.team_group(sec.team.pk), channel)
        try:
            # (on commit in production: the test's transaction never commits)
            await database_sync_to_async(live.push_escalation)(pay.approval.pk)
            first = await asyncio.wait_for(layer.receive(channel), 10)
            await database_sync_to_async(live.push_change)(
                call_id, Status.DENIED, Status.PENDING_APPROVAL, team_id=teams_seen
            )
            second = await asyncio.wait_for(layer.receive(channel), 10)
            return [first["html"], second["html"]]
        finally:
            await layer.group_discard(live.team_group(sec.team.pk), channel)

    pushed, removal = run_async(listen)
    assert pay.secret in pushed and "Escalated" in pushed
    assert f"call-{call_id}" in removal and pay.secret not in removal


def test_a_quorum_counts_the_next_tiers_votes(teams: tuple[TeamWorld, TeamWorld]) -> None:
    pay, sec = teams
    ApprovalRequest.objects.filter(pk=pay.approval.pk).update(approvals_required=2)
    set_escalation(team=pay.team, after=30, to=sec.team, actor="test")
    services.escalate_due(created(pay) + timedelta(seconds=31))
    assert decide(pay.client("reviewer"), pay.approval).status_code == 302
    assert decide(sec.client("reviewer"), pay.approval).status_code == 302
    assert status_of(pay.approval) == Status.QUEUED


# --- Separation of duties ---------------------------------------------------------------


def test_the_sponsor_and_the_oauth_person_may_not_approve(settings: Any) -> None:
    from oauth2_provider.models import get_application_model

    from agentauth.models import AgentClient

    settings.HARNESS_FORBID_SELF_APPROVAL = True
    world = make_team("own")
    sponsor = make_user(unique("sponsor"), groups=("reviewer",))
    person = make_user(unique("person"), groups=("reviewer",))
    agents.transfer_agent(agent=world.agent.agent, actor="test", sponsor=sponsor)
    application = get_application_model().objects.create(
        name="client",
        client_type="public",
        authorization_grant_type="authorization-code",
        redirect_uris="http://localhost/cb",
    )
    AgentClient.objects.create(
        agent=world.agent.agent,
        owner=person,
        application=application,
        team=world.team,
        mode="standard",
        registered_via="manual",
    )
    for who, what in ((sponsor, "sponsor"), (person, "sign-in started")):
        client = Client()
        client.force_login(who)
        response = decide(client, world.approval)
        assert response.status_code == 403 and what in response.content.decode()
    assert status_of(world.approval) == Status.PENDING_APPROVAL
    channel = Channel.objects.create(name="mail", kind=Kind.EMAIL, config={"addresses": []})
    names = {u.username for u in notifications.recipients(channel, world.approval)}
    assert world.members["reviewer"].username in names
    assert not names & {sponsor.username, person.username, world.agent.owner.username}
    assert decide(world.client("reviewer"), world.approval).status_code == 302
    assert status_of(world.approval) == Status.QUEUED


def test_set_escalation_refuses_a_team_escalating_to_itself() -> None:
    team = make_team("solo").team
    with pytest.raises(TeamError, match="itself"):
        set_escalation(team=team, after=10, to=team, actor="test")
