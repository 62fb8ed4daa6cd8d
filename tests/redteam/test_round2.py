"""Red-team, round 2: attacks on the trust-boundary fixes of 72fca5e..85bc1a4 (single
sign-on's links, a leaver's agents, device codes, system workspaces, a team admin's
reading of rules). Each test is an attack; it passes when the attack fails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth.models import User
from django.test import Client

from audit.models import AuditEvent
from dispatcher import agents
from dispatcher.gateways import mcp_http
from dispatcher.models import Agent
from dispatcher.policy import managed
from dispatcher.tools import sandbox, sandbox_servers
from floor.errors import ServiceError
from teams.models import Team
from teams.services import add_member, create_team
from tests.support import oidc
from tests.support.factories import make_user, unique
from tests.support.oauth import (
    MCP,
    DocumentServer,
    documents,
    member,
    no_wrong_codes_counted,
    pending_device_code,
    refresh,
    sign_in_agent,
    signed_in,
)
from tests.teams.world import make_team

pytestmark = pytest.mark.django_db
__all__ = ["documents", "no_wrong_codes_counted"]  # the fixtures, imported to be used here


# --- A workspace that holds a system directory -------------------------------------------


def test_a_workspace_that_holds_var_is_refused() -> None:
    """/var holds /var/lib (databases, dpkg's maintainer scripts) and /var/spool (crontabs):
    a workspace inside either is refused, so one holding both must be too. As root,
    give_to_sandbox would hand every file under /var to the sandbox user."""
    for holder in ("/var", "/var/../var", "/var/lib/.."):
        reason = sandbox.exposed_state(Path(holder).resolve())
        assert reason is not None and "holds system" in reason, holder
    owner = make_user(unique("owner"))
    with pytest.raises(ServiceError, match="The workspace /var holds system"):
        agents.create_agent(owner=owner, name=unique("var"), workspace="/var/lib/..", actor="t")
    assert not Agent.objects.filter(owner=owner).exists()
    # A project of its own beside them stays a workspace.
    assert sandbox.exposed_state(Path("/var/tmp/project")) is None  # noqa: S108


# --- A team admin reads no other team's rules --------------------------------------------


def test_a_team_admin_reads_no_other_teams_policy_layer() -> None:
    """A team's layer says what its agents run and allow, as an owner's profile does: the
    policy page shows a team admin the organization's layer and their own teams', never
    another team's (its rules, its history)."""
    pay, infra = make_team("pay"), make_team("infra")
    secret = f"write_file(infra-layer-{unique('x')}.txt)"
    mine = f"write_file(pay-layer-{unique('x')}.txt)"
    managed.set_layer(team=infra.team, document={"deny": [secret]}, actor="cli")
    managed.set_layer(team=pay.team, document={"deny": [mine]}, actor="cli")
    page = pay.client("admin").get("/permissions/policy/")
    assert page.status_code == 200
    text = page.content.decode()
    assert mine in text
    assert secret not in text and infra.team.name not in text
    org = Client()
    org.force_login(make_user(unique("org-admin"), groups=("admin",)))
    assert secret in org.get("/permissions/policy/").content.decode()


# --- Single sign-on never links a privileged account by email ----------------------------


@pytest.fixture
def provider(settings: Any) -> Iterator[oidc.Provider]:
    with oidc.oidc_provider() as running:
        oidc.configure(settings, running)
        yield running


def _org_admin() -> User:
    admin = make_user(unique("boss"), groups=("admin",))
    admin.email = f"{admin.username}@corp.test"
    admin.save()
    return admin


@pytest.mark.parametrize(
    "spelling",
    [
        str.upper,  # allauth matches addresses without case
        lambda email: email.replace("@corp.test", "@CORP.TEST"),
        lambda email: email + ".",  # a trailing dot: another address, never the admin
        lambda email: email.replace("@", "+x@"),  # a tag: another address
    ],
)
def test_no_spelling_of_an_admins_email_signs_in_as_the_admin(
    provider: oidc.Provider, spelling: Any
) -> None:
    admin = _org_admin()
    sub = unique("mallory")
    provider.set_person(sub, email=spelling(admin.email), email_verified=True)
    client = Client()
    oidc.sign_in(client, provider, sub)
    assert client.get("/").wsgi_request.user.pk != admin.pk
    assert not SocialAccount.objects.filter(user=admin).exists()


def test_a_second_address_of_an_admin_links_no_provider(provider: oidc.Provider) -> None:
    from allauth.account.models import EmailAddress

    admin = _org_admin()
    other = f"{unique('alias')}@corp.test"
    EmailAddress.objects.create(user=admin, email=other, verified=True, primary=False)
    sub = unique("mallory")
    provider.set_person(sub, email=other, email_verified=True)
    client = Client()
    assert oidc.sign_in(client, provider, sub).status_code == 403
    assert not client.get("/").wsgi_request.user.is_authenticated
    assert not SocialAccount.objects.filter(user=admin).exists()


def test_an_identity_linked_by_email_does_not_sign_in_as_the_account_made_admin(
    provider: oidc.Provider,
) -> None:
    """The threat 72fca5e answers (a provider vouching for someone's address) could wait:
    the identity links to the ordinary account by email, and was an admin's once the
    account was promoted. A link made by email now never signs in to a privileged
    account; its owner connects the provider from the account instead."""
    from audit.roles import ADMIN, grant_role

    person = make_user(unique("dev"))
    person.email = f"{person.username}@corp.test"
    person.save()
    sub = unique("mallory")
    provider.set_person(sub, email=person.email, email_verified=True)
    assert oidc.sign_in(Client(), provider, sub).status_code == 302  # linked by email
    grant_role(user=person, role=ADMIN, actor="test")
    later = Client()
    assert oidc.sign_in(later, provider, sub).status_code == 403
    assert not later.get("/").wsgi_request.user.is_authenticated
    refused = AuditEvent.objects.filter(kind="sso.link_refused", subject=f"user:{person.username}")
    assert refused.get().payload["uid"] == sub
    # The owner, signed in, takes the link away and connects the provider themselves.
    person.set_password("new-" + person.username)  # allauth wiped it when linking by email
    person.save()
    owner = Client()
    assert owner.login(username=person.username, password="new-" + person.username)
    link = SocialAccount.objects.get(user=person)
    # (removing asks for the password again first: SOCIALACCOUNT_REAUTHENTICATION_REQUIRED)
    password = {"password": "new-" + person.username}
    removing = owner.post("/accounts/3rdparty/", {"account": link.pk})
    assert removing.status_code == 302
    assert removing["Location"].startswith("/accounts/reauthenticate/")
    assert SocialAccount.objects.filter(user=person).exists()
    assert owner.post(removing["Location"], password).status_code == 302
    assert not SocialAccount.objects.filter(user=person).exists()
    # (asked just now: the connect right after does not ask again)
    assert oidc.sign_in(owner, provider, sub, process="connect").status_code == 302
    again = Client()
    assert oidc.sign_in(again, provider, sub).status_code == 302
    assert again.get("/").wsgi_request.user.pk == person.pk
    made = AuditEvent.objects.filter(kind="sso.linked", subject=f"user:{person.username}")
    assert [e.payload["by"] for e in made.order_by("pk")] == ["email", "connect"]


# --- A leaver's signed-in agents stay stopped --------------------------------------------


def test_a_leavers_refresh_token_and_coming_back_bring_no_agent_back(
    documents: DocumentServer,
) -> None:
    """The agent a person signed in for a team is revoked when they leave it: its refresh
    token makes no new token, and adding them back does not revive it (a new consent makes
    a new agent)."""
    from agentauth.models import AgentClient
    from teams.services import remove_member

    team = create_team(name=unique("team"), actor="test")
    person = member(team)
    client_id, first = sign_in_agent(documents, person, team=team)
    assert mcp_http.authenticate(first["access_token"], "", MCP)[0] is not None
    old = AgentClient.objects.get(owner=person, team=team).agent

    remove_member(team=team, user=person, role="reviewer", actor="admin:ops")
    assert refresh(client_id, first["refresh_token"]).status_code == 400
    add_member(team=team, user=person, role="reviewer", actor="admin:ops")
    assert mcp_http.authenticate(first["access_token"], "", MCP) == (None, None)
    assert refresh(client_id, first["refresh_token"]).status_code == 400
    old.refresh_from_db()
    assert not old.is_active

    _, again = sign_in_agent(documents, person, team=team, client_id=client_id)
    agent = mcp_http.authenticate(again["access_token"], "", MCP)[0]
    assert agent is not None and agent.pk != old.pk


def test_the_group_map_taking_a_team_and_the_org_admin_role_stops_both_agents(
    documents: DocumentServer, settings: Any
) -> None:
    """One sign-in whose groups no longer grant a team role nor the organization's admin
    role: the agent signed in for that team and the one for a team only the admin role
    reached both stop, whichever of the two the map takes first."""
    import json

    from agentauth.models import AgentClient
    from identity.group_map import parse_group_map

    sre = unique("sre")
    settings.HARNESS_SSO_GROUP_MAP = parse_group_map(
        json.dumps({"sre": f"team:{sre}:admin", "harness-admins": "org:admin"})
    )
    unjoined = create_team(name=unique("ops"), actor="test")
    with oidc.oidc_provider() as provider:
        oidc.configure(settings, provider)
        settings.HARNESS_OUTBOUND_ALLOW = ["127.0.0.1"]  # the provider and the documents
        sub = unique("grp")
        email = f"{sub}@corp.test"
        provider.set_person(sub, email=email, email_verified=True, groups=["sre", "harness-admins"])
        assert oidc.sign_in(Client(), provider, sub).status_code == 302
        person = User.objects.get(email=email)
        mapped = Team.objects.get(name=sre)
        issued = {
            team.pk: sign_in_agent(documents, person, team=team)[1]["access_token"]
            for team in (mapped, unjoined)
        }
        for access in issued.values():
            assert mcp_http.authenticate(access, "", MCP)[0] is not None
        provider.set_person(sub, email=email, email_verified=True, groups=[])
        assert oidc.sign_in(Client(), provider, sub).status_code == 302
    for access in issued.values():
        assert mcp_http.authenticate(access, "", MCP) == (None, None)
    assert not AgentClient.objects.filter(owner=person, agent__is_active=True).exists()


# --- Device codes: one count per person, whatever the spelling or the session -------------


def test_device_code_guesses_count_across_sessions_spellings_and_denials(
    no_wrong_codes_counted: None,
) -> None:
    """Ten wrong codes lock the person out, spread over two sign-ins, typed as accept or
    deny, and spelled as the right code in lower case or with spaces (the code is matched
    exactly: another spelling is a wrong code); a GET with a code tries nothing."""
    from oauth2_provider.models import DeviceGrant

    team = create_team(name=unique("team"), actor="test")
    guesser = member(team)
    code = pending_device_code()
    one, two = signed_in(guesser), signed_in(guesser)
    form = {"team": str(team.pk), "mode": "standard"}
    spellings = [code.lower(), " ".join(code), f"{code[:4]}-{code[4:]}", f"\t{code[::-1]}"]
    guesses = [g for g in spellings if g.strip() != code]  # a blank around it: the code
    guesses += [f"WRONG{n:03}" for n in range(10 - len(guesses))]
    for n, guess in enumerate(guesses):
        browser, action = (one, "accept") if n % 2 else (two, "deny")
        assert browser.get("/oauth/device/", {"user_code": code}).status_code == 200
        answer = browser.post("/oauth/device/", {**form, "action": action, "user_code": guess})
        assert answer.status_code == (429 if n == 9 else 400), (n, guess, answer.status_code)
    refused = one.post("/oauth/device/", {**form, "action": "deny", "user_code": code})
    assert refused.status_code == 429
    assert DeviceGrant.objects.get(user_code=code).status == DeviceGrant.AUTHORIZATION_PENDING
    assert AuditEvent.objects.filter(kind="agent.device_codes_locked").count() == 1


# --- A server's writable path is held to the workspace's rule -----------------------------


WRITABLE_REFUSED = ("/root", "/var/spool", "/var/lib", "/var/log", "/boot", "/var", "/home")


def test_no_server_gets_a_writable_system_directory(tmp_path: Path) -> None:
    """A stdio server's `:rw` path is given to the sandbox user when Harness is root, as a
    workspace is, and a team admin registers servers for their team: /root (.ssh),
    /var/spool (crontabs), /var/lib (databases), /boot, /var and /home whole are refused
    as a workspace is (65c141f). Checked on the rule alone: the attack, if it worked,
    would give this host's /var to the sandbox user (it once did, running this test
    through the page as root)."""
    for where in WRITABLE_REFUSED:
        if not Path(where).exists():
            continue
        problem = sandbox_servers.server_path_problem(f"{where}:rw")
        assert problem is not None and "cannot be writable" in problem, (where, problem)
    # A directory of its own stays writable, and a system directory stays readable.
    assert sandbox_servers.server_path_problem(f"{tmp_path}:rw") is None
    assert sandbox_servers.server_path_problem("/var/lib:ro") is None
