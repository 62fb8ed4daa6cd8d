"""Signing in through a real SAML 2.0 identity provider on loopback (nanoidp): a signed
assertion signs a new person in; an email the IdP is not trusted for never takes over
an account; a tampered assertion is refused."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth.models import User
from django.test import Client

from identity.group_map import groups_in
from identity.sso_config import providers_from_env, socialaccount_providers
from tests.support import saml_idp
from tests.support.factories import make_user, unique

pytestmark = [pytest.mark.django_db, pytest.mark.heavy]


@pytest.fixture(scope="module")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Any:
    users = {
        "erin": {"password": "erin-pw", "email": "erin@corp.test", "groups": ["sre"]},
        "alice": {"password": "alice-pw", "email": "alice-saml@corp.test"},
    }
    with saml_idp.saml_idp(tmp_path_factory.mktemp("nanoidp"), users) as running:
        yield running


def configure(settings: Any, idp: saml_idp.SamlIdp, **more: Any) -> None:
    import json

    env = {
        "HARNESS_SSO_PROVIDERS": json.dumps([idp.provider_entry(**more)]),
        "HARNESS_PUBLIC_URL": "http://harness.test",
    }
    settings.HARNESS_SSO = providers_from_env(env)
    settings.SOCIALACCOUNT_PROVIDERS = socialaccount_providers(settings.HARNESS_SSO)
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "harness.test"]


def sign_in(
    client: Client, idp: saml_idp.SamlIdp, username: str, password: str, tamper: bool = False
) -> Any:
    start = client.post("/accounts/saml/nano/login/", {"process": "login"})
    assert start.status_code == 302 and start["Location"].startswith(idp.sso_url), start
    action, form = idp.sign_in(start["Location"], username, password)
    assert saml_idp.acs_path(action) == "/accounts/saml/nano/acs/"
    if tamper:
        xml = base64.b64decode(form["SAMLResponse"]).replace(b"@corp.test", b"@evil.test")
        form["SAMLResponse"] = base64.b64encode(xml).decode()
    return client.post(saml_idp.acs_path(action), form, follow=True)


def test_a_signed_assertion_signs_a_new_person_in(settings: Any, idp: saml_idp.SamlIdp) -> None:
    configure(settings, idp)
    client = Client(headers={"host": "harness.test"})
    sign_in(client, idp, "erin", "erin-pw")
    user = client.get("/").wsgi_request.user
    assert user.is_authenticated and user.email == "erin@corp.test"
    account = SocialAccount.objects.get(user=user, provider="nano")
    [nano] = settings.HARNESS_SSO
    assert groups_in(account.extra_data, nano.kind, nano.groups_claim) == ["sre"]


def test_a_tampered_assertion_is_refused(settings: Any, idp: saml_idp.SamlIdp) -> None:
    configure(settings, idp)
    client = Client(headers={"host": "harness.test"})
    response = sign_in(client, idp, "erin", "erin-pw", tamper=True)
    assert not client.get("/").wsgi_request.user.is_authenticated
    assert not User.objects.filter(email__endswith="@evil.test").exists()
    assert response.status_code == 401  # allauth: "Third-Party Login Failure"


def test_an_untrusted_email_does_not_take_over_an_account(
    settings: Any, idp: saml_idp.SamlIdp
) -> None:
    configure(settings, idp)
    alice = make_user(unique("alice"), groups=("reviewer",))
    alice.email = "alice-saml@corp.test"
    alice.save()
    client = Client(headers={"host": "harness.test"})
    response = sign_in(client, idp, "alice", "alice-pw")
    assert response.status_code == 403
    assert not client.get("/").wsgi_request.user.is_authenticated


@pytest.mark.parametrize("role", ["", "auditor", "reviewer"])
def test_a_trusted_idp_links_the_existing_account_unless_it_is_privileged(
    settings: Any, idp: saml_idp.SamlIdp, role: str
) -> None:
    """An account with no role is linked by the trusted email; a reviewer's, who decides
    calls, or an auditor's, who reads other people's agents' calls, never is by email
    alone (identity.adapters.is_privileged)."""
    configure(settings, idp, trust_emails=True)
    alice = make_user(unique("alice"), groups=(role,) if role else ())
    alice.email = "alice-saml@corp.test"
    alice.save()
    client = Client(headers={"host": "harness.test"})
    response = sign_in(client, idp, "alice", "alice-pw")
    if not role:
        assert client.get("/").wsgi_request.user.pk == alice.pk
        return
    assert response.status_code == 403 and "approves agents' calls" in response.content.decode()
    assert not client.get("/").wsgi_request.user.is_authenticated
