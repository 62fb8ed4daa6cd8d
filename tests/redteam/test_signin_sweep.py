"""Red-team sweep of how agents and people sign in (agentauth: the OAuth server of /mcp/
and the hooks; identity: people's sign-in): each test is an attack and what Harness
answers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import pytest
from django.test import Client
from oauth2_provider.models import AccessToken, DeviceGrant

from agentauth import services
from dispatcher.gateways import mcp_http
from tests.support.factories import unique
from tests.support.oauth import (
    HOOKS,
    REDIRECT,
    DocumentServer,
    documents,
    harness_hook_client,
    member,
    signed_in,
)

pytestmark = pytest.mark.django_db
__all__ = ["documents"]

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def device_start(client_id: str = "harness-hook") -> Any:
    harness_hook_client()
    return Client().post(
        "/oauth/device-authorization/",
        urlencode({"client_id": client_id, "resource": HOOKS}),
        content_type="application/x-www-form-urlencoded",
    )


def at_once(n: int, request: Callable[[], Any]) -> list[Any]:
    """`request` made by `n` threads released together; the answers of those that did not
    raise (each thread gives its database connection back)."""
    import threading

    from django.db import connection

    barrier = threading.Barrier(n)
    answers: list[Any] = []

    def race() -> None:
        try:
            barrier.wait()
            answers.append(request())
        finally:
            connection.close()

    threads = [threading.Thread(target=race) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def device_token(device_code: str, client_id: str = "harness-hook") -> Any:
    return Client().post(
        "/oauth/token/",
        {
            "grant_type": DEVICE_GRANT,
            "device_code": device_code,
            "client_id": client_id,
            "resource": HOOKS,
        },
    )


def approved_device() -> tuple[dict[str, Any], Any]:
    """A device code `harness-hook login` asked for, approved by a new member."""
    started = device_start()
    assert started.status_code == 200, started.content
    codes = started.json()
    person = member()
    page = signed_in(person).post(
        "/oauth/device/",
        {
            "user_code": codes["user_code"],
            "action": "accept",
            "team": person.team_memberships.get().team_id,
        },
    )
    assert page.status_code == 200, page.content[:300]
    return codes, page.context["approved"]


def test_a_device_code_is_exchanged_for_tokens_once_only() -> None:
    """The device code is the device's one-time proof of the person's approval. Were it
    good until it expires (30 minutes), whoever read it from the device (or its log) would
    mint tokens of their own for the person's agent, and the person's "sign out" of the
    agent (every token revoked, the agent kept) would be undone by the next exchange."""
    codes, agent = approved_device()
    first = device_token(codes["device_code"])
    assert first.status_code == 200, first.content
    assert mcp_http.authenticate(first.json()["access_token"], "", HOOKS)[0] == agent
    again = device_token(codes["device_code"])
    assert again.status_code == 400, again.content
    assert again.json()["error"] in ("expired_token", "invalid_grant"), again.content
    # Signed out: the device code does not sign the agent in again.
    services.sign_out_agent(agent=agent, actor="test")
    assert device_token(codes["device_code"]).status_code == 400
    assert not AccessToken.objects.filter(harness__agent=agent).exists()


def test_a_device_token_request_without_its_device_code_is_a_400_not_a_500() -> None:
    answer = Client().post(
        "/oauth/token/", {"grant_type": DEVICE_GRANT, "client_id": "harness-hook"}
    )
    assert answer.status_code == 400, answer.content
    assert answer.json()["error"] == "invalid_request"


def test_only_a_device_client_gets_device_codes(documents: DocumentServer) -> None:
    """The device page tells the person the code is `harness-hook login`'s. A client whose
    metadata document registered it for authorization codes (any https URL, fetched for
    anyone, no sign-in needed) must not get device codes: its own name ("Harness Hook
    (official)") would become the person's agent's, approved on a page that names
    harness-hook, and every unauthenticated request would fetch and register a document."""
    client_id = documents.client(
        f"/{unique('client')}.json", [REDIRECT], name="Harness Hook (official)"
    )
    answer = device_start(client_id)
    assert answer.status_code in (400, 401), answer.content
    assert answer.json()["error"] in ("unauthorized_client", "invalid_client")
    assert not DeviceGrant.objects.filter(client_id=client_id).exists()
    fetched = len(documents.fetched)
    other = documents.client(f"/{unique('client')}.json", [REDIRECT])
    assert device_start(other).status_code in (400, 401)
    assert len(documents.fetched) == fetched  # nothing fetched for an anonymous caller
    assert device_start().status_code == 200  # harness-hook's own client still works


# --- People: a passkey is no door beside the identity provider --------------------------


def passkey_sign_in(client: Client, person: Any, key: Any) -> Any:
    """allauth.mfa's "Sign in with a passkey": the options, then the discoverable
    credential's assertion (its user handle names the person)."""
    from allauth.account.utils import user_pk_to_url_str
    from fido2.utils import websafe_decode, websafe_encode

    options = client.get(
        "/accounts/2fa/webauthn/login/", headers={"X-Requested-With": "XMLHttpRequest"}
    )
    assert options.status_code == 200, options.content
    challenge = websafe_decode(options.json()["request_options"]["publicKey"]["challenge"])
    assertion = key.assertion(challenge)
    handle = user_pk_to_url_str(person).encode()
    assertion["response"]["userHandle"] = websafe_encode(handle)
    return client.post("/accounts/2fa/webauthn/login/", {"credential": json.dumps(assertion)})


@pytest.mark.parametrize("break_glass", [False, True])
def test_with_sso_only_a_passkey_signs_nobody_in_beside_the_identity_provider(
    settings: Any, break_glass: bool
) -> None:
    """HARNESS_SSO_ONLY: people are who the identity provider says, their roles and teams
    follow its groups on every sign-in. A passwordless passkey sign-in went around it: a
    person the IdP disabled, or removed from the admins' group, kept signing in (with the
    roles of their last SSO sign-in), and a break-glass account's passkey sign-in was
    neither audited as break-glass nor told to the admins."""
    from tests.support.factories import make_user
    from tests.support.passkeys import SoftPasskey

    person = make_user(unique("person"), groups=("admin",))
    settings.HARNESS_SSO_ONLY = True
    settings.HARNESS_BREAK_GLASS_USERS = [person.username] if break_glass else []
    settings.MFA_WEBAUTHN_ALLOW_INSECURE_ORIGIN = True  # the test client's http origin
    key = SoftPasskey()
    key.register(person)
    client = Client()
    answer = passkey_sign_in(client, person, key)
    assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/")
    assert "_auth_user_id" not in client.session
    assert client.get("/approvals/").status_code == 302
    # and the sign-in page offers no passkey button that could only be refused
    page = Client().get("/accounts/login/").content.decode()
    assert "passkey_login" not in page


def test_without_sso_only_a_passkey_still_signs_its_person_in(settings: Any) -> None:
    from tests.support.factories import make_user
    from tests.support.passkeys import SoftPasskey

    person = make_user(unique("person"), groups=("reviewer",))
    settings.HARNESS_SSO_ONLY = False
    settings.MFA_WEBAUTHN_ALLOW_INSECURE_ORIGIN = True
    key = SoftPasskey()
    key.register(person)
    client = Client()
    answer = passkey_sign_in(client, person, key)
    assert answer.status_code == 302 and not answer["Location"].startswith("/accounts/login/")
    assert client.session["_auth_user_id"] == str(person.pk)


def test_an_anonymous_token_or_revocation_request_fetches_no_client_document(
    documents: DocumentServer,
) -> None:
    """A client's metadata document is fetched when a signed-in person is asked to consent
    to it (/oauth/authorize/). The token and revocation endpoints take anyone's request:
    were an unknown client_id fetched there, anyone could make Harness GET any URL its
    outbound door reaches (hosts HARNESS_OUTBOUND_ALLOW opens for its identity provider or
    MCP servers included) and store a client for each, with no sign-in."""
    from oauth2_provider.models import get_application_model

    applications = get_application_model().objects
    before = applications.count()
    for n in range(3):
        client_id = documents.client(f"/{unique('client')}.json", [REDIRECT])
        for path, data in (
            (
                "/oauth/token/",
                {
                    "grant_type": "authorization_code",
                    "code": "x",
                    "code_verifier": "y" * 43,
                    "redirect_uri": "http://127.0.0.1:5/callback",
                },
            ),
            ("/oauth/token/", {"grant_type": "refresh_token", "refresh_token": "hrr_x"}),
            ("/oauth/revoke/", {"token": "hro_x"}),
        ):
            answer = Client().post(path, {**data, "client_id": client_id})
            assert answer.status_code in (200, 400, 401), (n, path, answer.content)
    assert documents.fetched == []
    assert applications.count() == before


@pytest.mark.django_db(transaction=True)
def test_a_refresh_token_sent_by_several_requests_at_once_gets_one_answer_each(
    documents: DocumentServer,
) -> None:
    """A client whose processes refresh at the same moment (or a thief racing it): one
    request rotates the refresh token; django-oauth-toolkit hands the others its "already
    rotated" answer, the winner's tokens as stored (hashed at rest, RFC 9700), and its
    token view then looked the hashed value up again: a 500 for every loser. Each loser
    gets a 400 invalid_grant, and no second token is made: without the lock on the
    refresh token a request that validated it before the rotation committed made a new
    pair of its own when a third request's reuse had ended the family meanwhile (two
    200s, two live tokens of one refresh token)."""

    from oauth2_provider.models import AccessToken

    from tests.support.oauth import refresh, sign_in_agent

    client_id, first = sign_in_agent(documents, member())
    answers = at_once(6, lambda: refresh(client_id, first["refresh_token"]))
    assert len(answers) == 6, "a request raised (a 500)"
    won = [a for a in answers if a.status_code == 200]
    assert len(won) == 1, [(a.status_code, a.content[:80]) for a in answers]
    for lost in answers:
        if lost.status_code != 200:
            assert lost.status_code == 400, lost.content
            assert lost.json()["error"] == "invalid_grant", lost.content
    # No second token came of the one refresh token (the reuse protection may have ended
    # the family, the winner's token with it: that is its rule for a refresh token sent
    # twice).
    assert AccessToken.objects.count() <= 1


@pytest.mark.parametrize("kind", ["oidc", "saml"])
@pytest.mark.parametrize("written", ["false", "no", "0", 0, None, "true"])
def test_trust_emails_written_as_anything_but_a_json_boolean_fails_at_start_up(
    kind: str, written: Any
) -> None:
    """`"trust_emails": "false"` in HARNESS_SSO_PROVIDERS was read with bool(): true. The
    provider's every email then counted as verified, and an unverified address (one a
    person typed at the IdP) linked the account that has it: a takeover."""
    from django.core.exceptions import ImproperlyConfigured

    from identity.sso_config import providers_from_env

    entry: dict[str, Any] = {"type": kind, "id": "corp", "trust_emails": written}
    if kind == "oidc":
        entry |= {"issuer": "https://idp.example", "client_id": "harness"}
    else:
        entry |= {
            "entity_id": "https://idp.example",
            "sso_url": "https://idp.example/sso",
            "x509cert": "MIIC",
        }
    with pytest.raises(ImproperlyConfigured, match="trust_emails"):
        providers_from_env({"HARNESS_SSO_PROVIDERS": json.dumps([entry])})
    for value in (True, False):
        (provider,) = providers_from_env(
            {"HARNESS_SSO_PROVIDERS": json.dumps([entry | {"trust_emails": value}])}
        )
        assert provider.trust_emails is value


@pytest.mark.parametrize(
    "redirect",
    ["http://evil.example/cb", "http://10.0.0.5:8080/cb", "http://127.0.0.1.evil.example/cb"],
)
def test_a_client_document_with_a_cleartext_redirect_is_refused(
    documents: DocumentServer, redirect: str
) -> None:
    """A client's redirect URIs are https, or http on the loopback interface only (RFC
    8252 for native clients; MCP's authorization spec; RFC 9700 2.6). A metadata document
    naming a plain-http redirect elsewhere had its consent page shown, and the code would
    cross the network in the clear."""
    from oauth2_provider.cimd import CIMDError

    from agentauth.cimd import DoorFetcher
    from tests.support.oauth import authorize_params, pkce

    client_id = documents.client(f"/{unique('client')}.json", [redirect])
    with pytest.raises(CIMDError, match="redirect"):
        DoorFetcher().fetch(client_id)
    page = signed_in(member()).get(
        "/oauth/authorize/", authorize_params(client_id, pkce()[1], redirect_uri=redirect)
    )
    assert page.status_code == 400, page.status_code
    assert "code=" not in page.get("Location", "")


@pytest.mark.parametrize(
    "redirect",
    [
        "http://127.0.0.1/callback",
        "http://[::1]/callback",
        "http://localhost/cb",
        "https://app.example/cb",
    ],
)
def test_loopback_and_https_redirects_still_register(
    documents: DocumentServer, redirect: str
) -> None:
    from agentauth.cimd import DoorFetcher

    client_id = documents.client(f"/{unique('client')}.json", [redirect])
    data, _ = DoorFetcher().fetch(client_id)
    assert data["redirect_uris"] == [redirect]


def test_a_link_cannot_fill_in_the_device_code_for_the_person() -> None:
    """RFC 8628 5.4 (remote phishing): an attacker runs `harness-hook login` on their own
    machine and sends the person https://harness/oauth/device/?user_code=THEIRS. The page
    came up with the attacker's code filled in, team and profile chosen: one press of
    Approve made the attacker's machine the person's agent. harness-hook prints the page
    and the code apart (no verification_uri_complete), and the page asks the person to
    type the code their own terminal showed: a code from a link is not filled in."""
    started = device_start()
    code = started.json()["user_code"]
    person = member()
    page = signed_in(person).get("/oauth/device/", {"user_code": code})
    assert page.status_code == 200
    assert code not in page.content.decode()
    assert "verification_uri_complete" not in started.json()


def test_a_refresh_validated_before_a_rotation_and_a_reuse_makes_no_live_token(
    documents: DocumentServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving the race above hits now and then, made to happen: request B has
    validated the refresh token; meanwhile request A rotates it and request C sends it
    again (the reuse protection ends the family). B then saved a brand-new pair in the
    ended family: a live token from a refresh token that was used twice."""
    from oauth2_provider.models import AccessToken

    from agentauth.validators import AgentValidator
    from tests.support.oauth import refresh, sign_in_agent

    client_id, first = sign_in_agent(documents, member())
    validate = AgentValidator.validate_refresh_token
    interleaved: list[Any] = []
    started: list[bool] = []

    def validate_then_interleave(self: Any, *args: Any, **kwargs: Any) -> bool:
        ok = validate(self, *args, **kwargs)
        if ok and not started:
            started.append(True)
            interleaved.append(refresh(client_id, first["refresh_token"]))  # A rotates
            interleaved.append(refresh(client_id, first["refresh_token"]))  # C: reuse
        return bool(ok)

    monkeypatch.setattr(AgentValidator, "validate_refresh_token", validate_then_interleave)
    late = refresh(client_id, first["refresh_token"])  # B
    assert [a.status_code for a in interleaved] == [200, 400]
    assert late.status_code == 400, late.content
    assert late.json()["error"] == "invalid_grant"
    assert not AccessToken.objects.exists()  # the family is ended, nothing minted after
