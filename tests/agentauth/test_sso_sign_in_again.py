"""An account made by single sign-on, with no password, passkey nor email address, has
nothing to confirm who it is with when approving an agent needs a recent sign-in: it is offered to
sign in again at its identity provider (a real OpenID provider on loopback), asked to
make the person sign in again, and comes back to approve."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from allauth.socialaccount.models import SocialAccount
from django.test import Client
from oauth2_provider.models import DeviceGrant

from teams.services import add_member, create_team
from tests.support import oidc
from tests.support.factories import unique
from tests.support.oauth import pending_device_code

pytestmark = [pytest.mark.django_db, pytest.mark.heavy]


@pytest.fixture
def provider(settings: Any) -> Iterator[oidc.Provider]:
    with oidc.oidc_provider() as running:
        oidc.configure(settings, running)
        yield running


def _signed_in_long_ago(browser: Client) -> None:
    """Age allauth's records of the session's sign-ins past the 5 minutes."""
    session = browser.session
    records = session["account_authentication_methods"]
    for record in records:
        record["at"] = time.time() - 3600
    session["account_authentication_methods"] = records
    session.save()


def _device_form(code: str, team: Any) -> dict[str, str]:
    return {"user_code": code, "action": "accept", "team": str(team.pk), "mode": "standard"}


def test_a_single_sign_on_account_signs_in_again_at_its_provider_to_approve(
    provider: oidc.Provider,
) -> None:
    sub = unique("sub")
    provider.set_person(sub, preferred_username=sub)  # (no email: no emailed code either)
    browser = Client()
    assert oidc.sign_in(browser, provider, sub).status_code == 302
    person = SocialAccount.objects.get(provider="sso", uid=sub).user
    assert not person.has_usable_password() and not person.email
    team = create_team(name=unique("team"), actor="test")
    add_member(team=team, user=person, role="reviewer", actor="test")
    _signed_in_long_ago(browser)
    code = pending_device_code()

    refused = browser.post("/oauth/device/", _device_form(code, team))
    assert refused.status_code == 403
    page = refused.content.decode()
    assert "Sign in again with Test IdP" in page
    start = refused.context["providers"][0][1]
    assert DeviceGrant.objects.get(user_code=code).status == DeviceGrant.AUTHORIZATION_PENDING

    to_provider = browser.post(start)
    assert to_provider.status_code == 302
    asked = parse_qs(urlsplit(to_provider["Location"]).query)
    assert to_provider["Location"].startswith(provider.issuer)
    assert asked["prompt"] == ["login"]  # the provider is told to ask again
    back = urlsplit(provider.approve(to_provider["Location"], sub))
    landed = browser.get(f"{back.path}?{back.query}")
    assert landed.status_code == 302 and landed["Location"] == "/oauth/device/"
    assert browser.get("/").wsgi_request.user == person  # still, and only, themselves

    done = browser.post("/oauth/device/", _device_form(code, team))
    assert done.status_code == 200, done.content[:500]
    assert DeviceGrant.objects.get(user_code=code).status == DeviceGrant.AUTHORIZED
