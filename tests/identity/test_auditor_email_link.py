"""An identity provider's verified email never links the account of an auditor (red team
finding; docs/identity.md, "Which emails link to an existing account"), through the real
OpenID provider on loopback.

Before, auditors were not privileged: a provider that vouched for an auditor's address
(an attacker's account at a provider that verifies nothing, or a mailbox an attacker
took over at the provider) signed its holder in as that auditor, who reads other
people's agents' calls, their arguments and results, organization-wide or in a team:
the whole audit log handed over by an email. Now the organization's auditors and every
team's auditors are privileged too: their owner signs in locally and connects the
provider; an identity linked by email before they became one is refused from then on.
Someone with no role is still linked by a verified email.
"""

from __future__ import annotations

from typing import Any

import pytest
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth.models import User
from django.test import Client

from audit.models import AuditEvent
from teams.services import add_member, create_team
from tests.support import oidc
from tests.support.factories import make_user, unique

pytestmark = [pytest.mark.django_db, pytest.mark.heavy]


@pytest.fixture
def provider(settings: Any) -> Any:
    with oidc.oidc_provider() as running:
        oidc.configure(settings, running)
        yield running


def with_email(user: User) -> User:
    user.email = f"{user.username}@corp.test"
    user.save()
    return user


def auditing(kind: str) -> User:
    """A person who reads other people's agents' calls: the organization's auditor, or a
    team's."""
    if kind == "org-auditor":
        return with_email(make_user(unique("aud"), groups=("auditor",)))
    person = with_email(make_user(unique("team-aud")))
    team = create_team(name=unique("pay"), actor="test")
    add_member(team=team, user=person, role="auditor", actor="test")
    return person


@pytest.mark.parametrize("kind", ["org-auditor", "team-auditor"])
def test_a_verified_email_never_links_an_auditors_account(
    provider: oidc.Provider, kind: str
) -> None:
    auditor = auditing(kind)
    sub = unique("mallory")
    provider.set_person(sub, email=auditor.email, email_verified=True, preferred_username="m")
    client = Client()
    response = oidc.sign_in(client, provider, sub)
    assert response.status_code == 403  # before: 302, signed in as the auditor
    page = response.content.decode()
    assert "reads other people's agents' calls" in page and "connect Test IdP" in page
    assert not client.get("/").wsgi_request.user.is_authenticated
    assert client.get("/audit/sessions/").status_code == 302  # to the login page
    assert not SocialAccount.objects.filter(user=auditor).exists()
    assert User.objects.filter(email__iexact=auditor.email).count() == 1  # no look-alike
    refused = AuditEvent.objects.get(kind="sso.link_refused", subject=f"user:{auditor.username}")
    assert refused.payload["uid"] == sub


def test_an_identity_linked_by_email_is_refused_once_its_account_audits(
    provider: oidc.Provider,
) -> None:
    """Linked by email while ordinary, then made a team's auditor: the next sign-in
    through that link is refused, as for an account made admin or reviewer since."""
    person = with_email(make_user(unique("later")))
    sub = unique("sub")
    provider.set_person(sub, email=person.email, email_verified=True, preferred_username="p")
    assert oidc.sign_in(Client(), provider, sub).status_code == 302  # ordinary: linked
    team = create_team(name=unique("pay"), actor="test")
    add_member(team=team, user=person, role="auditor", actor="test")
    again = Client()
    assert oidc.sign_in(again, provider, sub).status_code == 403  # before: 302
    assert not again.get("/").wsgi_request.user.is_authenticated
    assert AuditEvent.objects.filter(kind="sso.link_refused", subject=f"user:{person.username}")


def test_an_auditor_connects_the_provider_from_their_account(provider: oidc.Provider) -> None:
    auditor = auditing("org-auditor")
    sub = unique("aud-sub")
    provider.set_person(sub, email=auditor.email, email_verified=True, preferred_username="a")
    client = Client()
    assert client.login(username=auditor.username, password="pw-" + auditor.username)
    back = oidc.sign_in(client, provider, sub, process="connect")
    assert back["Location"].startswith("/accounts/reauthenticate/")
    connected = client.post(back["Location"], {"password": "pw-" + auditor.username})
    assert connected.status_code == 302, connected.content
    fresh = Client()
    assert oidc.sign_in(fresh, provider, sub).status_code == 302
    assert fresh.get("/").wsgi_request.user.pk == auditor.pk


def test_someone_with_no_role_is_still_linked_by_a_verified_email(
    provider: oidc.Provider,
) -> None:
    person = with_email(make_user(unique("dev")))
    sub = unique("sub")
    provider.set_person(sub, email=person.email, email_verified=True, preferred_username="d")
    client = Client()
    assert oidc.sign_in(client, provider, sub).status_code == 302
    assert client.get("/").wsgi_request.user.pk == person.pk
