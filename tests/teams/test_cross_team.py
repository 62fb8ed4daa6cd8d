"""Everything is scoped: a member of one team, whatever their role there, calling every
page of the URLconf with the other team's ids, reading exports, receiving notifications
and using one-tap links, sees and decides nothing of the other team; the organization's
roles see both (issue 33)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core import mail
from django.test import Client
from django.urls import Resolver404, resolve

from approvals import links
from approvals import services as approvals
from approvals.notifications import services as notifications
from approvals.notifications.models import Channel, Kind
from audit.models import AuditEvent
from dispatcher.gateways import mcp
from dispatcher.models import Status
from dispatcher.tools import registry
from teams.models import Team
from tests.battery.test_policy_corpus import concrete, patterns
from tests.support.factories import submit_one
from tests.teams.world import TEAM_ROLES, TeamWorld, make_team, org_client, unchanged

pytestmark = pytest.mark.django_db

# Signed out, the Web Push worker, and the admin (staff only: organization-wide by design).
SKIPPED = ("api/", "admin/", "accounts/", "approvals/sw.js")


@pytest.fixture
def teams() -> tuple[TeamWorld, TeamWorld]:
    return make_team("pay"), make_team("infra")


def body(response: Any) -> str:
    if getattr(response, "streaming", False):

        async def read() -> bytes:
            chunks = response.streaming_content
            if hasattr(chunks, "__aiter__"):
                return b"".join([chunk async for chunk in chunks])
            return b"".join(chunks)

        return async_to_sync(read)().decode(errors="replace")
    return response.content.decode(errors="replace")


def values_of(world: TeamWorld, stranger: TeamWorld) -> dict[str, str]:
    """Every URL parameter filled with `world`'s objects (a link token: one made for the
    stranger's reviewer, for this team's ask)."""
    token = links.make_token(world.approval, stranger.members["reviewer"], "approve")
    return {
        "approval_id": str(world.approval.pk),
        "session_id": str(world.session.pk),
        "agent_id": str(world.agent.agent.pk),
        "user_id": str(world.agent.owner.pk),
        "grant_id": str(world.grant.pk),
        "team_id": str(world.team.pk),
        "channel_id": "1",
        "name": world.server.name,
        "exposed": world.tool.exposed_name,
        "token": token,
        "fmt": "jsonl",
        "str": "x",
        "int": "1",
        "uuid": str(world.session.pk),
        "path": "x",
    }


def form_of(world: TeamWorld, stranger: TeamWorld) -> dict[str, str]:
    """A POST body that would change `world` if it were accepted."""
    member = stranger.members["reviewer"]
    return {
        "action": "approve",
        "digest": world.approval.digest,
        "arguments": '{"path": "edited.txt", "content": "y"}',
        "user": str(world.agent.owner.pk),
        "rule": "write_file(*)",
        "version": "1",
        "fingerprint": world.tool.fingerprint,
        "name": "stolen",
        "owner": member.username,
        "team": world.team.name,
        "role": "reviewer",
        "mode": "trusted",
        "allow": "write_file(*)",
    }


def walk(client: Client, world: TeamWorld, stranger: TeamWorld) -> tuple[int, list[str]]:
    """GET and POST every page with `world`'s ids as `client`; what showed `world`."""
    values = values_of(world, stranger)
    tried, shown = 0, []
    for text, _entry in patterns():
        if text.startswith(SKIPPED) or not text:
            continue
        url = concrete(text, values)
        if url is None:
            continue
        try:
            resolve(url.split("?")[0])
        except Resolver404:
            continue
        for method in ("get", "post"):
            tried += 1
            if method == "get":
                response = client.get(url)
            else:
                response = client.post(url, form_of(world, stranger))
            page = body(response)
            leaks = [m for m in world.markers if m in page]
            if leaks:
                shown.append(f"{method.upper()} {url} -> {response.status_code}: {leaks}")
    return tried, shown


@pytest.mark.heavy
@pytest.mark.parametrize("role", TEAM_ROLES)
def test_every_page_called_by_a_member_of_the_other_team_shows_and_decides_nothing(
    teams: tuple[TeamWorld, TeamWorld], role: str
) -> None:
    pay, infra = teams
    tried, shown = walk(infra.client(role), pay, infra)
    assert tried >= 60
    assert shown == []
    assert unchanged(pay) == []
    # (and the other way round)
    tried, shown = walk(pay.client(role), infra, pay)
    assert shown == [] and unchanged(infra) == []


@pytest.mark.heavy
def test_each_team_sees_its_own_and_the_organization_sees_both(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    pay, infra = teams
    pages = {
        "reviewer": ["/approvals/", "/"],
        "auditor": ["/audit/sessions/", "/audit/export/"],
        "admin": ["/agents/", "/permissions/", "/tools/", "/teams/"],
    }
    for role, urls in pages.items():
        for url in urls:
            own = body(pay.client(role).get(url))
            assert (
                pay.agent.agent.name in own or pay.team.name in own or str(pay.session.pk) in own
            ), (role, url)
            everything = body(org_client(role).get(url))
            for world in (pay, infra):
                assert any(
                    m in everything
                    for m in (world.agent.agent.name, world.team.name, str(world.session.pk))
                ), (role, url, world.team.name)


def test_a_reviewer_of_another_team_cannot_decide_or_edit_and_is_told_why(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    pay, infra = teams
    stranger = infra.members["reviewer"]
    with pytest.raises(approvals.DecisionRefused) as refused:
        approvals.decide(
            approval_id=pay.approval.pk, user=stranger, approve=True, digest=pay.approval.digest
        )
    assert refused.value.status == 403 and "another team's agent" in str(refused.value)
    with pytest.raises(approvals.DecisionRefused) as refused:
        approvals.edit(
            approval_id=pay.approval.pk,
            user=stranger,
            digest=pay.approval.digest,
            arguments={"path": "other.txt", "content": "y"},
        )
    assert refused.value.status == 403
    response = infra.client("reviewer").post(
        f"/approvals/{pay.approval.pk}/decide",
        {"action": "approve", "digest": pay.approval.digest},
    )
    assert response.status_code == 403 and "another team's agent" in body(response)
    assert not any(m in body(response) for m in pay.markers)
    # Nothing was recorded of the attempt on the call (not even a digest mismatch).
    assert not AuditEvent.objects.filter(
        subject=f"call:{pay.approval.call_id}", actor=f"user:{stranger.username}"
    ).exists()
    assert unchanged(pay) == []
    # The team's own reviewer decides it.
    decided = approvals.decide(
        approval_id=pay.approval.pk,
        user=pay.members["reviewer"],
        approve=False,
        digest=pay.approval.digest,
    )
    assert decided.decision == "denied"


def test_a_one_tap_link_of_a_reviewer_of_another_team_shows_and_decides_nothing(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    pay, infra = teams
    url = links.make_url(pay.approval, infra.members["reviewer"], "approve")
    path = url.split("://", 1)[-1].split("/", 1)[1]
    client = infra.client("reviewer")
    for response in (
        client.get(f"/{path}"),
        client.post(f"/{path}", {"digest": pay.approval.digest}),
    ):
        assert response.status_code == 403
        assert "does not review this agent" in body(response)
        assert not any(m in body(response) for m in pay.markers)
    assert unchanged(pay) == []
    # The same link made for the team's reviewer opens the call.
    own = links.make_url(pay.approval, pay.members["reviewer"], "approve")
    own_path = own.split("://", 1)[-1].split("/", 1)[1]
    assert pay.secret in body(pay.client("reviewer").get(f"/{own_path}"))


def test_an_ask_notifies_its_teams_reviewers_and_the_organizations_only(
    teams: tuple[TeamWorld, TeamWorld], settings: Any
) -> None:
    pay, infra = teams
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    for world in (pay, infra):
        for user in world.members.values():
            user.email = f"{user.username}@example.com"
            user.save()
    org = org_client("reviewer")
    org_reviewer = org.session["_auth_user_id"]
    from django.contrib.auth.models import User

    org_user = User.objects.get(pk=org_reviewer)
    org_user.email = "org@example.com"
    org_user.save()
    channel = Channel.objects.create(name="mail", kind=Kind.EMAIL, config={"addresses": []})
    recipients = {u.username for u in notifications.recipients(channel, pay.approval)}
    assert pay.members["reviewer"].username in recipients
    assert org_user.username in recipients
    assert not recipients & {u.username for u in infra.members.values()}
    assert pay.members["auditor"].username not in recipients  # a reviewer's notice
    for delivery_id in notifications.plan_ask(pay.approval.pk):
        notifications.deliver(delivery_id)
    sent_to = {address for message in mail.outbox for address in message.to}
    assert sent_to == {pay.members["reviewer"].email, "org@example.com"}


def test_a_team_server_is_a_tool_of_its_teams_agents_only(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    pay, infra = teams
    names = {tool.name for tool in registry.all_tools(pay.team.pk)}
    assert pay.tool.exposed_name in names and infra.tool.exposed_name not in names
    offered = {tool.name for tool in mcp.offered_tools(pay.session)}
    assert pay.tool.exposed_name in offered and infra.tool.exposed_name not in offered
    # A call of another team's server's tool is refused as unknown, naming nothing of it.
    call = submit_one(pay.session, infra.tool.exposed_name, {"text": "hi"}, tool_use_id="x1")
    assert call.status == Status.REJECTED
    assert f"Tool '{infra.tool.exposed_name}' does not exist" in call.content
    assert infra.tool.exposed_name not in call.content.split("Available tools:")[1]
    # Its own team's tool resolves (and asks, in standard mode, as any upstream tool).
    own = submit_one(pay.session, pay.tool.exposed_name, {"text": "hi"}, tool_use_id="x2")
    assert own.status != Status.REJECTED, own.content
    # The agent API's tool list says the same.
    listed = Client().get("/api/v1/tools", headers=pay.agent.headers).json()
    listed_names = {t.get("name") or t.get("function", {}).get("name") for t in listed}
    assert pay.tool.exposed_name in listed_names and infra.tool.exposed_name not in listed_names


def test_an_organization_server_serves_every_team(teams: tuple[TeamWorld, TeamWorld]) -> None:
    pay, infra = teams
    from dispatcher.tools.sources import services as sources

    pay.server.team = None
    pay.server.save()
    sources._bump_generation()
    for world in (pay, infra):
        assert pay.tool.exposed_name in {t.name for t in registry.all_tools(world.team.pk)}


def test_only_organization_admins_make_teams_and_team_admins_change_their_teams_members(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    pay, infra = teams
    page = body(pay.client("admin").get(f"/teams/{pay.team.pk}/"))
    assert pay.agent.agent.name in page and pay.members["auditor"].username in page
    assert 'name="csrfmiddlewaretoken"' in page
    before = Team.objects.count()
    response = pay.client("admin").post("/teams/create", {"name": "rogue"})
    assert response.status_code == 403 and Team.objects.count() == before
    newcomer = infra.members["auditor"]
    response = pay.client("admin").post(
        f"/teams/{pay.team.pk}/members/add", {"user": newcomer.username, "role": "reviewer"}
    )
    assert response.status_code == 302
    assert pay.team.memberships.filter(user=newcomer, role="reviewer").exists()
    event = AuditEvent.objects.filter(kind="team.member_added").latest("id")
    assert event.actor == f"user:{pay.members['admin'].username}"
    response = pay.client("admin").post(
        f"/teams/{pay.team.pk}/members/remove", {"user": newcomer.username, "role": "reviewer"}
    )
    assert not pay.team.memberships.filter(user=newcomer, role="reviewer").exists()
    response = org_client("admin").post("/teams/create", {"name": "platform"})
    assert response.status_code == 302 and Team.objects.filter(name="platform").exists()
    # CSRF: a form posted without its token is refused.
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(pay.members["admin"])
    assert (
        strict.post(
            f"/teams/{pay.team.pk}/members/add", {"user": newcomer.username, "role": "admin"}
        ).status_code
        == 403
    )
    assert not pay.team.memberships.filter(user=newcomer, role="admin").exists()


def test_a_team_admin_makes_agents_for_their_team_only(teams: tuple[TeamWorld, TeamWorld]) -> None:
    pay, infra = teams
    client = pay.client("admin")
    owner = pay.members["reviewer"].username
    refused = client.post("/agents/", {"name": "x1", "owner": owner, "team": infra.team.name})
    assert refused.status_code == 400 and "one of the teams you administer" in body(refused)
    made = client.post("/agents/", {"name": "x2", "owner": owner, "team": pay.team.name})
    assert made.status_code == 200
    assert re.search(r"hrn_[0-9a-f]{8}_", body(made))
    assert pay.team.agents.filter(name="x2").exists()


def test_a_team_admins_rules_editor_names_no_tool_of_another_teams_server(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    pay, infra = teams
    page = body(infra.client("admin").get(f"/permissions/users/{infra.agent.owner.pk}/"))
    assert infra.tool.exposed_name in page
    assert pay.server.name not in page
    everything = body(org_client("admin").get(f"/permissions/users/{infra.agent.owner.pk}/"))
    assert pay.tool.exposed_name in everything and infra.tool.exposed_name in everything


def test_a_team_admin_reads_the_rules_only_of_people_wholly_in_their_teams(
    teams: tuple[TeamWorld, TeamWorld],
) -> None:
    """A person of another team added to this admin's team: their rules (which govern
    their other team's agents too) are neither changed nor read by this team's admin;
    a person wholly inside it is; an organization admin reads both."""
    from dispatcher.policy import profiles
    from teams.services import add_member

    pay, infra = teams
    shared = infra.agent.owner  # owns an agent of infra
    add_member(team=pay.team, user=shared, role="reviewer", actor="test")
    marker = "read_file(infra-only-secret-path/**)"
    for person in (shared, pay.agent.owner):
        profiles.update_profile(
            user=person, mode="standard", allow=[marker], ask=[], deny=[], actor="test"
        )
    admin = pay.client("admin")
    pages = {
        "": "get",
        "simulate": "post",
        "backtest": "post",
        "check": "post",
        "row": "get",
    }
    for page, method in pages.items():
        url = f"/permissions/users/{shared.pk}/{page}"
        refused = getattr(admin, method)(url)
        assert refused.status_code == 403, (url, refused.status_code)
        assert marker not in body(refused)
        assert "only an organization admin reads and changes them" in body(refused)
    index = body(admin.get("/permissions/"))
    assert shared.username in index and infra.agent.agent.name not in index
    assert f'href="/permissions/users/{shared.pk}/"' not in index
    assert "an organization admin reads and changes their rules" in index
    own = admin.get(f"/permissions/users/{pay.agent.owner.pk}/")
    assert own.status_code == 200 and marker in body(own)
    assert f'href="/permissions/users/{pay.agent.owner.pk}/"' in index
    everything = org_client("admin").get(f"/permissions/users/{shared.pk}/")
    assert everything.status_code == 200 and marker in body(everything)
