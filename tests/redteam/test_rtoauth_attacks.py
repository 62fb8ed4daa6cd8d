"""Red-team rtoauth: how agents sign in with OAuth, attacked with real HTTP requests
against a live daphne (Harness as the authorization server of /mcp/ and the hooks API;
dynamic client registration switched on, as HARNESS_OAUTH_DYNAMIC_REGISTRATION=true turns
it on), on the run's PostgreSQL and Redis."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from oauth2_provider.models import Application

from tests.support.factories import unique
from tests.support.live import LiveStack
from tests.support.oauth import document_server, pkce
from tests.support.oauth_live import OAuthStack, Person, oauth_daphne, query_of, team_member

pytestmark = [pytest.mark.live]
CALLBACK = "http://127.0.0.1:5555/callback"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
LOG_DIR: list[Path] = []  # where the module's daphne writes its log


@pytest.fixture(scope="module")
def stack(live_stack: LiveStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OAuthStack]:
    tmp = tmp_path_factory.mktemp("rtoauth")
    LOG_DIR[:] = [tmp]
    with (
        document_server(tmp) as documents,
        oauth_daphne(live_stack, documents, tmp, HARNESS_OAUTH_DYNAMIC_REGISTRATION="true") as s,
    ):
        yield s


def person(stack: OAuthStack) -> Person:
    owner = team_member()
    return Person(stack.url, owner.username, "pw-" + owner.username)


def register(who: Person, stack: OAuthStack, metadata: dict[str, Any]) -> httpx.Response:
    """A registration by a signed-in person's browser session (with its CSRF token)."""
    csrf = who.http.cookies.get("csrftoken") or ""
    return who.http.post(
        "/oauth/register/",
        json=metadata,
        headers={"X-CSRFToken": csrf, "Referer": stack.url + "/", "Origin": stack.url},
    )


def dcr_clients() -> set[str]:
    return set(
        Application.objects.filter(registration_source="dcr").values_list("client_id", flat=True)
    )


NATIVE = {
    "client_name": "Native Test",
    "redirect_uris": ["http://127.0.0.1/callback"],
    "grant_types": ["authorization_code", "refresh_token"],
    "token_endpoint_auth_method": "none",
}


def test_a_dynamic_registration_gets_its_client_id(stack: OAuthStack, live_db: None) -> None:
    """django-oauth-toolkit's answer names the client's configuration endpoint (RFC 7592),
    which Harness did not route: every registration was stored, then answered 500, and the
    client never learned its client_id (a row left behind per try)."""
    who = person(stack)
    answer = register(who, stack, NATIVE)
    assert answer.status_code == 201, answer.text[:300]
    client_id = answer.json()["client_id"]
    assert client_id in dcr_clients()
    assert answer.json()["registration_client_uri"].startswith(stack.url + "/oauth/register/")
    # The client signs a person in with the id it was given.
    verifier, challenge = pkce()
    query = urlencode(
        {
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": CALLBACK,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "state": "s",
            "resource": stack.url + "/mcp/",
        }
    )
    code = query_of(who.consent(f"{stack.url}/oauth/authorize/?{query}"))["code"]
    assert "(dcr)" in who.last_page  # the consent page says how the client was registered
    tokens = httpx.post(
        stack.url + "/oauth/token/",
        data={
            "grant_type": "authorization_code",
            "client_id": client_id,
            "code": code,
            "code_verifier": verifier,
            "redirect_uri": CALLBACK,
        },
    )
    assert tokens.status_code == 200, tokens.text
    # Its metadata cannot be rewritten afterwards (to what registration refuses, below).
    changed = httpx.put(
        answer.json()["registration_client_uri"],
        json={**NATIVE, "redirect_uris": ["http://evil.example/cb"]},
        headers={"Authorization": f"Bearer {answer.json()['registration_access_token']}"},
    )
    assert changed.status_code == 405
    assert Application.objects.get(client_id=client_id).redirect_uris == "http://127.0.0.1/callback"


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        # an authorization code sent in the clear across a network (a metadata document
        # naming this redirect is refused: agentauth.cimd)
        ({**NATIVE, "redirect_uris": ["http://evil.example/cb"]}, "loopback"),
        # a confidential client: Harness checks no client secret (token endpoint: "none")
        ({k: v for k, v in NATIVE.items() if k != "token_endpoint_auth_method"}, "public"),
        ({**NATIVE, "token_endpoint_auth_method": "client_secret_post"}, "public"),
        # grants with no person behind them, or the device grant under a name of one's own
        ({**NATIVE, "grant_types": ["client_credentials"], "redirect_uris": []}, "grant"),
        (
            {**NATIVE, "grant_types": ["urn:ietf:params:oauth:grant-type:device_code"]},
            "grant",
        ),
    ],
)
def test_a_registration_harness_cannot_serve_is_refused_and_stores_nothing(
    stack: OAuthStack, live_db: None, metadata: dict[str, Any], says: str
) -> None:
    before = dcr_clients()
    answer = register(person(stack), stack, metadata)
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["error"] in ("invalid_client_metadata", "invalid_redirect_uri")
    assert says in answer.json()["error_description"]
    assert dcr_clients() == before


def test_registrations_are_bounded_per_person(stack: OAuthStack, live_db: None) -> None:
    """Any signed-in person may register: without a bound, one script fills the client
    table (each row also holds a registration token that never expires)."""
    who = person(stack)
    answers = [register(who, stack, NATIVE).status_code for _ in range(11)]
    assert answers[:10] == [201] * 10, answers
    assert answers[10] == 429
    refused = register(who, stack, NATIVE)
    assert refused.status_code == 429
    assert "10 clients an hour" in refused.json()["error_description"]
    assert refused.headers["Retry-After"]
    # Someone else still registers.
    assert register(person(stack), stack, NATIVE).status_code == 201


def test_anonymous_or_cross_site_registration_is_refused(stack: OAuthStack, live_db: None) -> None:
    before = dcr_clients()
    assert httpx.post(stack.url + "/oauth/register/", json=NATIVE).status_code == 401
    who = person(stack)  # signed in, but the request carries no CSRF token
    answer = who.http.post(
        "/oauth/register/", json=NATIVE, headers={"Origin": "https://evil.example"}
    )
    assert answer.status_code == 401
    assert dcr_clients() == before


def _code_for(stack: OAuthStack, who: Person, resources: list[str]) -> tuple[str, str, str]:
    client_id = stack.documents.client(f"/{unique('client')}.json", ["http://127.0.0.1/callback"])
    verifier, challenge = pkce()
    query = [
        ("response_type", "code"),
        ("client_id", client_id),
        ("redirect_uri", CALLBACK),
        ("code_challenge", challenge),
        ("code_challenge_method", "S256"),
        ("state", "s"),
        *[("resource", r) for r in resources],
    ]
    code = query_of(who.consent(f"{stack.url}/oauth/authorize/?{urlencode(query)}"))["code"]
    return client_id, code, verifier


def test_a_token_names_one_resource(stack: OAuthStack, live_db: None) -> None:
    """A client that asked for both resources at the authorization endpoint got one
    token that /mcp/ and the hooks API each accepted (docs: each endpoint refuses a token
    for the other). One resource per token; a code for two is exchanged for one of them."""
    mcp, hooks = stack.url + "/mcp/", stack.url + "/api/v1/hooks/"
    who = person(stack)
    for asked in ([mcp, hooks], []):  # both named, or none (the code's two inherited)
        client_id, code, verifier = _code_for(stack, who, [mcp, hooks])
        body = [
            ("grant_type", "authorization_code"),
            ("client_id", client_id),
            ("code", code),
            ("code_verifier", verifier),
            ("redirect_uri", CALLBACK),
            *[("resource", r) for r in asked],
        ]
        answer = httpx.post(stack.url + "/oauth/token/", content=urlencode(body), headers=FORM)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"] == "invalid_target"
        assert "one resource" in answer.json()["error_description"]
    client_id, code, verifier = _code_for(stack, who, [mcp, hooks])
    body = [
        ("grant_type", "authorization_code"),
        ("client_id", client_id),
        ("code", code),
        ("code_verifier", verifier),
        ("redirect_uri", CALLBACK),
        ("resource", mcp),
    ]
    answer = httpx.post(stack.url + "/oauth/token/", content=urlencode(body), headers=FORM)
    assert answer.status_code == 200, answer.text
    access = answer.json()["access_token"]
    listed = httpx.post(
        mcp,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        headers={
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {access}",
        },
    )
    assert listed.status_code == 200
    # its refresh cannot widen it to the hooks API either
    widened = httpx.post(
        stack.url + "/oauth/token/",
        content=urlencode(
            [
                ("grant_type", "refresh_token"),
                ("client_id", client_id),
                ("refresh_token", answer.json()["refresh_token"]),
                ("resource", mcp),
                ("resource", hooks),
            ]
        ),
        headers=FORM,
    )
    assert widened.status_code == 400 and widened.json()["error"] == "invalid_target"


def test_what_held(stack: OAuthStack, live_db: None) -> None:
    """Attacks that found nothing, kept as checks: PKCE without a method (oauthlib's
    default is plain), redirect URI tricks, framing of the consent and device pages,
    revocation by another client, an introspection endpoint, a widened scope, tokens in
    the server's log."""
    who = person(stack)
    mcp = stack.url + "/mcp/"
    client_id = stack.documents.client(f"/{unique('client')}.json", ["http://127.0.0.1/callback"])
    verifier, challenge = pkce()
    base = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": CALLBACK,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "state": "s",
        "resource": mcp,
    }
    no_method = who.http.get(
        "/oauth/authorize/",
        params={**base, "code_challenge": verifier, "code_challenge_method": ""},
    )
    assert "code=" not in no_method.headers.get("location", "")
    for uri in (
        "http://127.0.0.1:5555/callback?x=1",
        "http://127.0.0.1:5555/callback/../x",
        "http://localhost:5555/callback",
        "http://127.0.0.1:5555@evil.example/callback",
        "http://127.0.0.1.evil.example:5555/callback",
        "http://127.0.0.1:5555/callback#f",
        "http://127.0.0.1:5555/CALLBACK",
    ):
        tricked = who.http.get("/oauth/authorize/", params={**base, "redirect_uri": uri})
        assert tricked.status_code == 400 and "location" not in tricked.headers, uri
    for page in (who.http.get("/oauth/authorize/", params=base), who.http.get("/oauth/device/")):
        assert page.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    consent_page = who.http.get("/oauth/authorize/", params=base)
    form = dict(
        re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', consent_page.text)
    )
    form.pop("csrfmiddlewaretoken")
    forged = who.http.post("/oauth/authorize/", data={**form, "allow": "Authorize"})
    assert forged.status_code == 403
    code = query_of(who.consent(f"{stack.url}/oauth/authorize/?{urlencode(base)}"))["code"]
    tokens = httpx.post(
        stack.url + "/oauth/token/",
        data={
            "grant_type": "authorization_code",
            "client_id": client_id,
            "code": code,
            "code_verifier": verifier,
            "redirect_uri": CALLBACK,
        },
    ).json()
    # With a token of this client alive, approval_prompt=auto skips the consent page in
    # django-oauth-toolkit: no agent was approved, so no code comes of it.
    _verifier2, challenge2 = pkce()
    auto = who.http.get(
        "/oauth/authorize/",
        params={**base, "code_challenge": challenge2, "approval_prompt": "auto"},
    )
    assert "code=" not in auto.headers.get("location", ""), auto.headers
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    auth = {"Accept": "application/json, text/event-stream"}
    from tests.support.oauth import harness_hook_client

    harness_hook_client()  # (the other client: made here, not left to an earlier test)
    other = httpx.post(
        stack.url + "/oauth/revoke/",
        data={"token": tokens["access_token"], "client_id": "harness-hook"},
    )
    assert other.status_code == 200  # RFC 7009 says so, and revokes nothing
    alive = httpx.post(
        mcp, json=call, headers={**auth, "Authorization": f"Bearer {tokens['access_token']}"}
    )
    assert alive.status_code == 200
    assert httpx.post(stack.url + "/oauth/introspect/", data={"token": "x"}).status_code == 404
    widened = httpx.post(
        stack.url + "/oauth/token/",
        data={
            "grant_type": "refresh_token",
            "client_id": client_id,
            "refresh_token": tokens["refresh_token"],
            "scope": "agent oauth2_provider:registration",
        },
    )
    assert widened.status_code == 400 and widened.json()["error"] == "invalid_scope"
    logs = "".join(p.read_text(errors="replace") for p in LOG_DIR[0].glob("*.log"))
    assert logs
    for secret in (tokens["access_token"], tokens["refresh_token"], code):
        assert secret not in logs


def test_a_token_request_cannot_name_the_agent_it_is_for(stack: OAuthStack, live_db: None) -> None:
    """oauthlib lets every body parameter be read as an attribute of its request, and the
    validator read the agent a token stands for with getattr(request, "harness_agent_id"):
    a grant that sets none (client credentials, a client an admin registered for a
    service) took it from the body, so the client's holder got a token of anyone's agent
    (here another person's, read back at /mcp/). Only the three grants Harness serves are
    accepted, and the agent is only ever the one a code, device code or refresh token
    names."""
    from dispatcher.agents import create_agent
    from teams.models import Team

    victim = team_member()
    agent, _bearer = create_agent(
        owner=victim,
        name=unique("victims-agent"),
        team=Team.objects.filter(memberships__user=victim).first(),
        actor="test",
    )
    service = Application.objects.create(
        name="Nightly report",
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_CLIENT_CREDENTIALS,
        client_secret="s3cret-" + unique("x"),
        hash_client_secret=False,
    )
    answer = httpx.post(
        stack.url + "/oauth/token/",
        data={
            "grant_type": "client_credentials",
            "harness_agent_id": str(agent.pk),
            "resource": stack.url + "/mcp/",
        },
        auth=(service.client_id, service.client_secret),
    )
    assert answer.status_code in (400, 401), answer.text
    assert "access_token" not in answer.text
    from agentauth.models import AgentToken

    assert not AgentToken.objects.filter(agent=agent).exists()


def test_a_device_polling_faster_than_its_interval_is_told_to_slow_down(
    stack: OAuthStack, live_db: None
) -> None:
    """RFC 8628 3.5: a device polls every `interval` (5) seconds; one polling faster was
    answered authorization_pending at any rate (django-oauth-toolkit leaves slow_down a
    TODO), each poll a request against the database from anyone holding a device code."""
    from datetime import timedelta

    from django.utils import timezone
    from oauth2_provider.models import DeviceGrant

    from tests.support.oauth import harness_hook_client

    harness_hook_client()
    hooks = stack.url + "/api/v1/hooks/"
    device = httpx.post(
        stack.url + "/oauth/device-authorization/",
        data={"client_id": "harness-hook", "resource": hooks},
    ).json()
    poll = {
        "grant_type": "urn:ietf:params:oauth:grant-type:device_code",
        "client_id": "harness-hook",
        "device_code": device["device_code"],
        "resource": hooks,
    }
    at_once = httpx.post(stack.url + "/oauth/token/", data=poll)
    assert at_once.status_code == 400 and at_once.json()["error"] == "slow_down", at_once.text
    # the interval passed (as if the device had waited 5 seconds)
    grant = DeviceGrant.objects.filter(device_code=device["device_code"])
    grant.update(last_checked=timezone.now() - timedelta(seconds=6))
    waited = httpx.post(stack.url + "/oauth/token/", data=poll)
    assert waited.json()["error"] == "authorization_pending"
    again = httpx.post(stack.url + "/oauth/token/", data=poll)
    assert again.json()["error"] == "slow_down"
    # An approved code is exchanged at the next poll, however soon.
    owner = team_member()
    Person(stack.url, owner.username, "pw-" + owner.username).approve_device(device["user_code"])
    tokens = httpx.post(stack.url + "/oauth/token/", data=poll)
    assert tokens.status_code == 200 and tokens.json()["access_token"].startswith("hro_")


def test_a_consent_racing_the_persons_removal_from_the_team_leaves_no_agent(
    stack: OAuthStack, live_db: None
) -> None:
    """Removing someone's last role in a team revokes the agents they signed in for it
    (agentauth.services.stop_agents_of_leaver). A consent whose membership check read the
    row before the removal committed made its agent after the removal's step had looked:
    an active agent, acting for a team its owner had left. The consent now locks the row
    that lets the person approve for the team, so it waits for the removal, then refuses."""
    import threading

    from django.db import connection, connections, transaction

    from dispatcher.models import Agent
    from teams.models import Membership
    from teams.services import remove_member

    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    owner = team_member()
    who = Person(stack.url, owner.username, "pw-" + owner.username)
    membership = Membership.objects.select_related("team").get(user=owner)
    client_id = stack.documents.client(f"/{unique('client')}.json", ["http://127.0.0.1/callback"])
    _verifier, challenge = pkce()
    query = urlencode(
        {
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": CALLBACK,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "state": "s",
            "resource": stack.url + "/mcp/",
        }
    )
    page = who.http.get(f"/oauth/authorize/?{query}")
    form = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page.text))
    form.update(team=str(membership.team_id), allow="Authorize")

    removed, release = threading.Event(), threading.Event()

    def remove() -> None:
        try:
            with transaction.atomic():
                remove_member(team=membership.team, user=owner, role=membership.role, actor="test")
                removed.set()
                release.wait(60)
        finally:
            connections.close_all()

    remover = threading.Thread(target=remove)
    remover.start()
    assert removed.wait(30)
    answers: list[httpx.Response] = []
    consenting = threading.Thread(
        target=lambda: answers.append(
            who.http.post(
                f"/oauth/authorize/?{query}", data=form, headers={"Referer": str(page.url)}
            )
        )
    )
    consenting.start()
    # Until the consent is answered, or waits for a lock (the removal holds it).
    with connection.cursor() as cursor:
        while consenting.is_alive():
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
            if cursor.fetchone()[0]:
                break
            consenting.join(0.05)
    release.set()
    remover.join(30)
    consenting.join(30)
    assert answers and answers[0].status_code == 403, answers and answers[0].text[:300]
    assert not Agent.objects.filter(owner=owner, team=membership.team, is_active=True).exists()


def test_an_oauth_token_in_an_audited_text_is_masked(live_db: None) -> None:
    """An agent's bearer token (hrn_) in a call's arguments was masked in the audit log,
    an OAuth access or refresh token (hro_, hrr_: a hook's credentials file read, a curl
    line) was kept as it is, for ever, in a log every auditor reads."""
    from agentauth.tokens import new_access_token, new_refresh_token
    from audit import kinds
    from audit.models import AuditEvent
    from audit.services import record_event

    access, refresh = new_access_token(None), new_refresh_token(None)
    text = f'cat creds.json # {{"access_token": "x", "note": "{access} {refresh}"}}'
    from django.db import transaction

    with transaction.atomic():
        event = record_event(
            kind=kinds.AGENT_AUTHORIZED,
            actor="test",
            subject=unique("agent:"),
            payload={"command": text, "line": f"echo {refresh} | gh auth"},
        )
    stored = str(AuditEvent.objects.get(pk=event.pk).payload)
    assert access not in stored and refresh not in stored
    assert access[4:] not in stored and refresh[4:] not in stored
    assert "[masked:harness-oauth-token" in stored
