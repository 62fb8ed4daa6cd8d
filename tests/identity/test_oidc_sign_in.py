"""Signing in through a real OpenID provider on loopback (oidc-provider-mock): a new
person gets an account, a verified email links an existing one, an unverified email never
takes one over."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit.models import AuditEvent
from tests.support import oidc
from tests.support.factories import make_user, unique

pytestmark = [pytest.mark.django_db, pytest.mark.heavy]


@pytest.fixture
def provider(settings: Any) -> Any:
    with oidc.oidc_provider() as running:
        oidc.configure(settings, running)
        yield running


def test_the_login_page_offers_the_provider_by_its_name(provider: oidc.Provider) -> None:
    page = Client().get("/accounts/login/").content.decode()
    assert "Sign in with Test IdP" in page
    assert 'action="/accounts/oidc/sso/login/?process=login"' in page
    assert 'id="password-sign-in"' in page  # without HARNESS_SSO_ONLY, passwords too


def test_a_new_person_signs_in_and_gets_an_account(provider: oidc.Provider) -> None:
    sub = unique("sub")
    provider.set_person(sub, email=f"{sub}@corp.test", email_verified=True, preferred_username=sub)
    client = Client()
    response = oidc.sign_in(client, provider, sub)
    assert response.status_code == 302 and response["Location"] == "/"
    user = User.objects.get(email=f"{sub}@corp.test")
    assert user.username == sub
    assert client.get("/").wsgi_request.user == user
    event = AuditEvent.objects.filter(kind="user.signed_in_sso", subject=f"user:{sub}").get()
    assert event.payload["provider"] == "sso"
    assert event.payload["uid"] == sub


def test_a_verified_email_links_the_existing_account(provider: oidc.Provider) -> None:
    # (someone with no role: an admin's, a reviewer's or an auditor's account is
    # privileged, never linked by email: test_reviewer_email_link.py,
    # test_auditor_email_link.py)
    alice = make_user(unique("alice"))
    alice.email = f"{alice.username}@corp.test"
    alice.save()
    sub = unique("sub")
    provider.set_person(sub, email=alice.email, email_verified=True, preferred_username="alice")
    client = Client()
    assert oidc.sign_in(client, provider, sub).status_code == 302
    assert client.get("/").wsgi_request.user.pk == alice.pk  # as alice
    assert User.objects.filter(email=alice.email).count() == 1


@pytest.mark.parametrize("verified", [False, None])
def test_an_unverified_email_never_takes_over_an_account(
    provider: oidc.Provider, verified: bool | None
) -> None:
    alice = make_user(unique("alice"), groups=("reviewer",))
    alice.email = f"{alice.username}@corp.test"
    alice.save()
    sub = unique("mallory")
    claims: dict[str, Any] = {"email": alice.email.upper(), "preferred_username": alice.username}
    if verified is not None:
        claims["email_verified"] = verified
    provider.set_person(sub, **claims)
    client = Client()
    response = oidc.sign_in(client, provider, sub)
    assert response.status_code == 403
    assert "did not say this email is verified" in response.content.decode()
    assert not client.get("/").wsgi_request.user.is_authenticated
    assert client.get("/approvals/").status_code == 302  # to the login page
    assert User.objects.filter(email__iexact=alice.email).count() == 1  # no look-alike
    refused = AuditEvent.objects.filter(kind="sso.refused", subject=f"sso:sso:{sub}")
    assert refused.get().payload["email"] == alice.email.lower()


def test_a_username_the_provider_proposes_never_names_an_existing_account(
    provider: oidc.Provider,
) -> None:
    alice = make_user(unique("alice"), groups=("reviewer",))
    sub = unique("sub")
    provider.set_person(
        sub, email=f"{sub}@elsewhere.test", email_verified=True, preferred_username=alice.username
    )
    client = Client()
    assert oidc.sign_in(client, provider, sub).status_code == 302
    person = client.get("/").wsgi_request.user
    assert person.pk != alice.pk and person.username != alice.username
    assert client.get("/approvals/").status_code == 403  # not alice's role


def _privileged(kind: str, settings: Any) -> User:
    user = make_user(unique(kind), groups=("admin",) if kind == "orgadmin" else ())
    user.email = f"{user.username}@corp.test"
    user.is_superuser = kind == "root"
    user.is_staff = kind == "staff"
    user.save()
    if kind == "glass":
        settings.HARNESS_BREAK_GLASS_USERS = [user.username]
    return user


@pytest.mark.parametrize("kind", ["root", "orgadmin", "glass", "staff"])
def test_a_verified_email_never_links_a_privileged_account(
    provider: oidc.Provider, settings: Any, kind: str
) -> None:
    """A provider that vouches for an admin's address (an attacker's IdP account, a
    provider that verifies nothing) does not sign anyone in as that admin."""
    admin = _privileged(kind, settings)
    sub = unique("mallory")
    provider.set_person(sub, email=admin.email, email_verified=True, preferred_username="m")
    client = Client()
    response = oidc.sign_in(client, provider, sub)
    assert response.status_code == 403
    page = response.content.decode()
    assert "holds administrative rights" in page
    assert "connect Test IdP" in page and 'href="/accounts/3rdparty/"' in page
    assert not client.get("/").wsgi_request.user.is_authenticated
    assert not admin.socialaccount_set.exists()
    assert User.objects.filter(email__iexact=admin.email).count() == 1  # no look-alike
    refused = AuditEvent.objects.filter(kind="sso.link_refused", subject=f"user:{admin.username}")
    assert refused.get().payload == {
        "provider": "sso",
        "uid": sub,
        "email": admin.email,
        "user": admin.username,
    }
    admin.refresh_from_db()
    assert admin.check_password("pw-" + admin.username)  # allauth's wipe never ran


def test_a_privileged_person_connects_the_provider_from_their_account(
    provider: oidc.Provider, settings: Any
) -> None:
    admin = _privileged("orgadmin", settings)
    sub = unique("admin-sub")
    provider.set_person(sub, email=admin.email, email_verified=True, preferred_username="a")
    # Connecting a provider account asks for the password again first
    # (SOCIALACCOUNT_REAUTHENTICATION_REQUIRED): a session taken over adds no way back in.
    client = Client()
    assert client.login(username=admin.username, password="pw-" + admin.username)
    back = oidc.sign_in(client, provider, sub, process="connect")
    assert back.status_code == 302 and back["Location"].startswith("/accounts/reauthenticate/")
    assert not admin.socialaccount_set.exists()
    wrong = client.post(back["Location"], {"password": "not-it"})
    assert wrong.status_code == 200 and not admin.socialaccount_set.exists()
    connected = client.post(back["Location"], {"password": "pw-" + admin.username})
    assert connected.status_code == 302, connected.content
    assert admin.socialaccount_set.get().uid == sub
    fresh = Client()
    assert oidc.sign_in(fresh, provider, sub).status_code == 302
    assert fresh.get("/").wsgi_request.user.pk == admin.pk
    assert not AuditEvent.objects.filter(kind="sso.link_refused").exists()
