"""An identity provider's verified email never links the account of someone who can
decide calls (red team finding; docs/identity.md, "Which emails link to an existing
account"), through the real OpenID provider on loopback.

Before, only admins (organization or team), superusers, staff and break-glass accounts
were privileged: a provider that vouched for a reviewer's address (an attacker's account
at a provider that verifies nothing) signed its holder in as that reviewer, who approves
agents' calls. Now the organization's reviewers and every team's reviewers are
privileged too: their owner signs in locally and connects the provider.
"""

from __future__ import annotations

from typing import Any

import pytest
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


def deciding(kind: str) -> User:
    """A person who can decide calls: the organization's reviewer, or a team's."""
    if kind == "org-reviewer":
        return with_email(make_user(unique("rev"), groups=("reviewer",)))
    person = with_email(make_user(unique("team-rev")))
    team = create_team(name=unique("pay"), actor="test")
    add_member(team=team, user=person, role="reviewer", actor="test")
    return person


@pytest.mark.parametrize("kind", ["org-reviewer", "team-reviewer"])
def test_a_verified_email_never_links_a_reviewers_account(
    provider: oidc.Provider, kind: str
) -> None:
    reviewer = deciding(kind)
    sub = unique("mallory")
    provider.set_person(sub, email=reviewer.email, email_verified=True, preferred_username="m")
    client = Client()
    response = oidc.sign_in(client, provider, sub)
    assert response.status_code == 403  # before: 302, signed in as the reviewer
    page = response.content.decode()
    assert "approves agents' calls" in page and "connect Test IdP" in page
    assert not client.get("/").wsgi_request.user.is_authenticated
    assert client.get("/approvals/").status_code == 302  # to the login page
    assert not reviewer.socialaccount_set.exists()
    assert User.objects.filter(email__iexact=reviewer.email).count() == 1  # no look-alike
    refused = AuditEvent.objects.get(kind="sso.link_refused", subject=f"user:{reviewer.username}")
    assert refused.payload["uid"] == sub


def test_an_identity_linked_by_email_is_refused_once_its_account_reviews(
    provider: oidc.Provider,
) -> None:
    """Linked by email while ordinary, then made a team's reviewer: the next sign-in
    through that link is refused, as for an account made admin since."""
    person = with_email(make_user(unique("later")))
    sub = unique("sub")
    provider.set_person(sub, email=person.email, email_verified=True, preferred_username="p")
    assert oidc.sign_in(Client(), provider, sub).status_code == 302  # ordinary: linked
    team = create_team(name=unique("pay"), actor="test")
    add_member(team=team, user=person, role="reviewer", actor="test")
    again = Client()
    assert oidc.sign_in(again, provider, sub).status_code == 403
    assert not again.get("/").wsgi_request.user.is_authenticated


def test_a_reviewer_connects_the_provider_from_their_account(provider: oidc.Provider) -> None:
    reviewer = deciding("team-reviewer")
    sub = unique("rev-sub")
    provider.set_person(sub, email=reviewer.email, email_verified=True, preferred_username="r")
    client = Client()
    assert client.login(username=reviewer.username, password="pw-" + reviewer.username)
    back = oidc.sign_in(client, provider, sub, process="connect")
    assert back["Location"].startswith("/accounts/reauthenticate/")
    connected = client.post(back["Location"], {"password": "pw-" + reviewer.username})
    assert connected.status_code == 302, connected.content
    fresh = Client()
    assert oidc.sign_in(fresh, provider, sub).status_code == 302
    assert fresh.get("/").wsgi_request.user.pk == reviewer.pk
