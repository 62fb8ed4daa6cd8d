"""Red-team rtoauth2: the OAuth fixes of rtoauth (agentauth) attacked again with real
HTTP requests against a live daphne (dynamic client registration switched on), on the
run's PostgreSQL and Redis."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from oauth2_provider.models import Application

from tests.support.factories import unique
from tests.support.live import LiveStack
from tests.support.oauth import document_server
from tests.support.oauth_live import OAuthStack, Person, oauth_daphne, team_member

pytestmark = [pytest.mark.live]
CAP = 3  # HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON of this module's daphne
CALLBACK = "http://127.0.0.1:5555/callback"


@pytest.fixture(scope="module")
def stack(live_stack: LiveStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OAuthStack]:
    tmp: Path = tmp_path_factory.mktemp("rtoauth2")
    with (
        document_server(tmp) as documents,
        oauth_daphne(
            live_stack,
            documents,
            tmp,
            HARNESS_OAUTH_DYNAMIC_REGISTRATION="true",
            HARNESS_MAX_SIGNED_IN_AGENTS_PER_PERSON=str(CAP),
        ) as s,
    ):
        yield s


def person(stack: OAuthStack) -> Person:
    owner = team_member()
    return Person(stack.url, owner.username, "pw-" + owner.username)


def register(who: Person, stack: OAuthStack, metadata: dict[str, Any]) -> httpx.Response:
    csrf = who.http.cookies.get("csrftoken") or ""
    return who.http.post(
        "/oauth/register/",
        json=metadata,
        headers={"X-CSRFToken": csrf, "Referer": stack.url + "/", "Origin": stack.url},
    )


NATIVE = {
    "client_name": "Native Test",
    "redirect_uris": ["http://127.0.0.1/callback"],
    "grant_types": ["authorization_code", "refresh_token"],
    "token_endpoint_auth_method": "none",
}


def test_a_client_parameter_does_not_open_the_metadata_document_fetch(
    stack: OAuthStack, live_db: None
) -> None:
    """The token and revocation endpoints take anyone's request, so a client_id URL no
    consent fetched names no client there: Harness fetches nothing, stores nothing. The
    guard read getattr(request, "client"), which oauthlib answers with a `client` body
    parameter: `client=1` skipped it, and Harness fetched the URL (anyone's, from inside
    its network) and stored a client row for it, unauthenticated."""
    for endpoint, body in (
        ("/oauth/token/", {"grant_type": "authorization_code", "code": "x", "code_verifier": "v"}),
        ("/oauth/token/", {"grant_type": "refresh_token", "refresh_token": "x"}),
        ("/oauth/revoke/", {"token": "x"}),
    ):
        path = f"/{unique('never-consented')}.json"
        client_id = stack.documents.client(path, ["http://127.0.0.1/callback"])
        answer = httpx.post(
            stack.url + endpoint, data={**body, "client_id": client_id, "client": "1"}
        )
        assert answer.status_code in (200, 400, 401), answer.text[:300]
        assert path not in stack.documents.fetched, endpoint
        assert not Application.objects.filter(client_id=client_id).exists(), endpoint
    # A client that exists is read as itself, whatever `client` says (no 500).
    from tests.support.oauth import harness_hook_client

    harness_hook_client()
    answer = httpx.post(
        stack.url + "/oauth/token/",
        data={
            "grant_type": "refresh_token",
            "refresh_token": "x",
            "client_id": "harness-hook",
            "client": "1",
        },
    )
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_grant", answer.text


@pytest.mark.parametrize(
    "uris",
    [
        ["https://ok.example/cb http://evil.example/cb"],
        ["https://ok.example/cb\thttp://evil.example/cb"],
        ["https://ok.example/cb\nhttp://evil.example/cb"],
    ],
)
def test_a_redirect_uri_holding_white_space_is_refused(
    stack: OAuthStack, live_db: None, uris: list[str]
) -> None:
    """django-oauth-toolkit stores a client's redirect URIs as one text, space-separated:
    one https URI holding a space passed the https-or-loopback check whole, and was stored
    as two, the second plain http across the network (a code sent in the clear)."""
    who = person(stack)
    answer = register(who, stack, {**NATIVE, "redirect_uris": uris})
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["error"] == "invalid_redirect_uri"
    assert not Application.objects.filter(redirect_uris__contains="evil.example").exists()


def test_registrations_sent_at_once_stay_within_the_hourly_bound(
    stack: OAuthStack, live_db: None
) -> None:
    """The bound was checked (dry run) before the registration and counted after it: 16
    registrations sent at once by one person each passed the check, and all were stored."""
    who = person(stack)
    csrf = who.http.cookies.get("csrftoken") or ""
    cookies = dict(who.http.cookies)
    statuses: list[int] = []
    start = threading.Barrier(16)

    def one() -> None:
        with httpx.Client(base_url=stack.url, cookies=cookies, timeout=60) as http:
            start.wait()
            answer = http.post(
                "/oauth/register/",
                json=NATIVE,
                headers={"X-CSRFToken": csrf, "Referer": stack.url + "/", "Origin": stack.url},
            )
            statuses.append(answer.status_code)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(statuses) <= {201, 429}, statuses
    assert statuses.count(201) <= 10, statuses


TOKEN = "hro_" + "Ab9_-" * 8


@pytest.mark.parametrize(
    "text",
    [
        # a URL inside a URL (a redirect's target, URL-encoded)
        "https://app.example/next?to=" + quote("https://cb.example/?access_token=" + TOKEN, ""),
        "https://app.example/?q=" + quote(json.dumps({"t": TOKEN}), ""),
        # JSON text (a tool's output) with the token after an escaped line break or tab
        json.dumps({"log": "token:\n" + TOKEN}),
        json.dumps({"log": "\t" + TOKEN.replace("hro_", "hrr_")}),
        # an agent's bearer token (hrn_), the same way
        "https://app.example/?q=" + quote("token=" + TOKEN.replace("hro_", "hrn_0a1b2c3d_"), ""),
    ],
)
def test_an_oauth_token_inside_encoded_text_is_masked(text: str) -> None:
    """hro_/hrr_ tokens are masked where a word boundary precedes them: after `%3D` or
    `%22` (URL-encoded `=` and `"`), or after a JSON escape (`\\n`), there is none, so the
    token was stored in the audit log as it was."""
    from audit.masking import mask_text

    masked = mask_text(text)
    assert TOKEN[4:] not in masked, masked
    assert "[masked:" in masked


def test_what_held(stack: OAuthStack, live_db: None) -> None:
    """Attacks that found nothing, kept as checks: another person's (or no) registration
    token at a client's management URL, a client an admin made, redirect URIs that look
    loopback but are not."""
    alice, bob = person(stack), person(stack)
    mine = register(alice, stack, NATIVE).json()
    theirs = register(bob, stack, NATIVE).json()
    url = mine["registration_client_uri"]
    for auth in ({}, {"Authorization": f"Bearer {theirs['registration_access_token']}"}):
        assert httpx.get(url, headers=auth).status_code == 401
        assert httpx.delete(url, headers=auth).status_code == 401
    # Bob's session (no bearer token) deletes nothing either.
    assert bob.http.delete(url.removeprefix(stack.url)).status_code == 401
    assert Application.objects.filter(client_id=mine["client_id"]).exists()
    admin_made = Application.objects.create(
        name="Admin's",
        client_type=Application.CLIENT_PUBLIC,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris="http://127.0.0.1/cb",
    )
    other = f"{stack.url}/oauth/register/{admin_made.client_id}/"
    bearer = {"Authorization": f"Bearer {mine['registration_access_token']}"}
    assert httpx.delete(other, headers=bearer).status_code == 401
    assert Application.objects.filter(pk=admin_made.pk).exists()
    for uri in (
        "http://127.0.0.1.evil.example/cb",
        "http://127.0.0.1:80@evil.example/cb",
        "http://evil.example#@127.0.0.1/cb",
        "http://evil.example\\@127.0.0.1/cb",
        "http://0x7f000001/cb",
        "http://2130706433/cb",
        "http://127.1/cb",
        "http://[::ffff:127.0.0.1]/cb",
        "http://localhost.evil.example/cb",
    ):
        answer = register(alice, stack, {**NATIVE, "redirect_uris": [uri]})
        assert answer.status_code == 400, uri


def _consent_form(
    stack: OAuthStack, who: Person, team_id: int | None = None
) -> tuple[str, dict[str, str]]:
    """A consent page opened for a new client: the URL to POST to and the form to send."""
    import re
    from urllib.parse import urlencode

    from tests.support.oauth import pkce

    client_id = stack.documents.client(f"/{unique('client')}.json", ["http://127.0.0.1/callback"])
    query = urlencode(
        {
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": CALLBACK,
            "code_challenge": pkce()[1],
            "code_challenge_method": "S256",
            "state": "s",
            "resource": stack.url + "/mcp/",
        }
    )
    page = who.http.get(f"/oauth/authorize/?{query}")
    assert page.status_code == 200, page.text[:300]
    form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text))
    team = re.search(r'<select name="team"[^>]*>\s*<option value="(\d+)"', page.text)
    form.update(team=str(team_id or (team and team.group(1))), allow="Authorize")
    return f"/oauth/authorize/?{query}", {**form, "_referer": str(page.url)}


def _post_all(
    who: Person, stack: OAuthStack, posts: list[tuple[str, dict[str, str]]]
) -> list[httpx.Response]:
    """The POSTs sent at once (each on its own connection, the person's session)."""
    cookies = dict(who.http.cookies)
    answers: list[httpx.Response] = []
    start = threading.Barrier(len(posts))

    def one(url: str, form: dict[str, str]) -> None:
        referer = form.pop("_referer", stack.url + "/")
        with httpx.Client(base_url=stack.url, cookies=cookies, timeout=60) as http:
            start.wait()
            answers.append(http.post(url, data=form, headers={"Referer": referer}))

    threads = [threading.Thread(target=one, args=post) for post in posts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_consents_and_device_approvals_at_once_stay_within_the_signed_in_cap(
    stack: OAuthStack, live_db: None
) -> None:
    """Five consents and two device approvals sent at once by a person one agent short of
    the cap: one passes, the others are refused with the cap's message (no 500)."""
    import re

    from agentauth.models import AgentClient
    from tests.support.oauth import harness_hook_client

    owner = team_member()
    who = Person(stack.url, owner.username, "pw-" + owner.username)
    for _ in range(CAP - 1):
        url, form = _consent_form(stack, who)
        referer = form.pop("_referer")
        assert who.http.post(url, data=form, headers={"Referer": referer}).status_code == 302
    posts = [_consent_form(stack, who) for _ in range(5)]
    harness_hook_client()
    page = who.http.get("/oauth/device/")
    token = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text))
    team = re.search(r'<select name="team"[^>]*>\s*<option value="(\d+)"', page.text)
    for _ in range(2):
        device = httpx.post(
            stack.url + "/oauth/device-authorization/",
            data={"client_id": "harness-hook", "resource": stack.url + "/api/v1/hooks/"},
        ).json()
        posts.append(
            (
                "/oauth/device/",
                {
                    "user_code": device["user_code"],
                    "action": "accept",
                    "csrfmiddlewaretoken": token["csrfmiddlewaretoken"],
                    "team": team.group(1) if team else "",
                    "_referer": str(page.url),
                },
            )
        )
    answers = _post_all(who, stack, posts)
    statuses = sorted(a.status_code for a in answers)
    assert 500 not in statuses, statuses
    # One new agent: a consent (302), or the device approvals (200: both are of one client,
    # harness-hook, so the second reuses the agent the first made), never both.
    consents = [a for a in answers if a.status_code == 302]
    devices = [a for a in answers if a.status_code == 200]
    assert len(consents) + (1 if devices else 0) == 1, statuses
    for refused in answers:
        if refused.status_code == 403:
            assert "agents signed in through clients" in refused.text, refused.text[:300]
    assert AgentClient.objects.filter(owner=owner, agent__is_active=True).count() == CAP


@pytest.mark.parametrize("leaving", ["team", "deactivated", "admin role"])
def test_a_consent_racing_a_leaver_step_ends_without_500_or_active_agent(
    stack: OAuthStack, live_db: None, leaving: str
) -> None:
    """A consent (the person's row, then their admin role or membership, locked) sent at
    the moment the person is removed from the team, deactivated, or loses the org admin
    role (each of which revokes their signed-in agents, one already held): no deadlock
    answered 500, and no active agent is left for the team they no longer reach."""
    from django.contrib.auth.models import Group
    from django.db import connection

    from audit.roles import ADMIN
    from dispatcher.models import Agent
    from teams.models import Membership

    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    for _ in range(4):
        owner = team_member()
        membership = Membership.objects.select_related("team").get(user=owner)
        if leaving == "admin role":
            membership.delete()  # (their reach is the org admin role only)
            owner.groups.add(Group.objects.get_or_create(name=ADMIN)[0])
        who = Person(stack.url, owner.username, "pw-" + owner.username)
        url, form = _consent_form(stack, who, membership.team_id)
        referer = form.pop("_referer")
        assert who.http.post(url, data=form, headers={"Referer": referer}).status_code == 302
        url, form = _consent_form(stack, who, membership.team_id)
        start = threading.Barrier(2)
        failures: list[BaseException] = []

        remover = threading.Thread(
            target=_leave, args=(leaving, owner, membership, start, failures)
        )
        remover.start()
        answers = _post_all_with_barrier(who, stack, url, form, start)
        remover.join(60)
        assert not failures, failures
        assert answers[0].status_code in (302, 403), answers[0].text[:500]
        assert not Agent.objects.filter(
            owner=owner, team=membership.team, is_active=True, oauth_client__isnull=False
        ).exists(), (leaving, answers[0].status_code)


def _post_all_with_barrier(
    who: Person, stack: OAuthStack, url: str, form: dict[str, str], start: threading.Barrier
) -> list[httpx.Response]:
    referer = form.pop("_referer")
    with httpx.Client(base_url=stack.url, cookies=dict(who.http.cookies), timeout=60) as http:
        start.wait()
        return [http.post(url, data=form, headers={"Referer": referer})]


def _leave(
    leaving: str,
    owner: Any,
    membership: Any,
    start: threading.Barrier,
    failures: list[BaseException],
) -> None:
    """The person leaves (as `leaving` says), in its own transaction and connection."""
    from django.db import connections, transaction

    from audit.roles import ADMIN, deactivate, remove_role
    from teams.services import remove_member

    try:
        start.wait()
        with transaction.atomic():
            if leaving == "team":
                remove_member(team=membership.team, user=owner, role=membership.role, actor="t")
            elif leaving == "deactivated":
                deactivate(user=owner, actor="t")
            else:
                remove_role(user=owner, role=ADMIN, actor="t")
    except BaseException as error:  # noqa: BLE001 - reported by the test
        failures.append(error)
    finally:
        connections.close_all()


def test_a_client_deleted_by_its_registration_token_leaves_no_active_agent(
    stack: OAuthStack, live_db: None
) -> None:
    """RFC 7592 DELETE removes the client, and with it (cascade) each agent's link to it
    and its tokens; the agents stayed active, linked to nothing: out of the signed-in cap's
    count (a person could hold any number: register, consent, delete, again), and out of
    the leaving steps' reach (they revoke agents linked to a client), so handed to a
    sponsor at deactivation as active agents. Each agent of the client is revoked."""
    import re
    from urllib.parse import urlencode

    from dispatcher.models import Agent
    from tests.support.oauth import pkce
    from tests.support.oauth_live import query_of

    owner = team_member()
    who = Person(stack.url, owner.username, "pw-" + owner.username)
    registered = register(who, stack, {**NATIVE, "redirect_uris": [CALLBACK]}).json()
    query = urlencode(
        {
            "response_type": "code",
            "client_id": registered["client_id"],
            "redirect_uri": CALLBACK,
            "code_challenge": pkce()[1],
            "code_challenge_method": "S256",
            "state": "s",
            "resource": stack.url + "/mcp/",
        }
    )
    assert "code" in query_of(who.consent(f"{stack.url}/oauth/authorize/?{query}"))
    agent = Agent.objects.get(
        owner=owner, oauth_client__application__client_id=registered["client_id"]
    )
    deleted = httpx.delete(
        registered["registration_client_uri"],
        headers={"Authorization": f"Bearer {registered['registration_access_token']}"},
    )
    assert deleted.status_code == 204, deleted.text
    agent.refresh_from_db()
    assert not agent.is_active
    from audit.models import AuditEvent

    revoked = AuditEvent.objects.get(kind="agent.revoked", subject=f"agent:{agent.pk}")
    assert revoked.actor == f"user:{owner.username}"
    # The person's Agents page shows it revoked.
    page = who.http.get("/account/agents/").text
    assert re.search(re.escape(agent.name), page)
