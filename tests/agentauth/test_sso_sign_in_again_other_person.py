"""Signing in again at the identity provider, from the agent approval's "Sign in again
with" form, as someone else (another person at the same browser, or the provider's
session of another account): the browser is then that other person's, and the code the
first person was approving stays pending; the other person approves nothing by coming
back (the device page asks for a code again)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

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


def test_signing_in_again_as_another_person_approves_nothing(provider: oidc.Provider) -> None:
    first, other = unique("sub"), unique("sub")
    provider.set_person(first, preferred_username=first)
    provider.set_person(other, preferred_username=other)
    elsewhere = Client()
    assert oidc.sign_in(elsewhere, provider, other).status_code == 302
    other_person = SocialAccount.objects.get(provider="sso", uid=other).user
    browser = Client()
    assert oidc.sign_in(browser, provider, first).status_code == 302
    person = SocialAccount.objects.get(provider="sso", uid=first).user
    team = create_team(name=unique("team"), actor="test")
    add_member(team=team, user=person, role="reviewer", actor="test")
    add_member(team=team, user=other_person, role="reviewer", actor="test")
    session = browser.session
    records = session["account_authentication_methods"]
    for record in records:
        record["at"] = time.time() - 3600
    session["account_authentication_methods"] = records
    session.save()
    code = pending_device_code()
    form = {"user_code": code, "action": "accept", "team": str(team.pk), "mode": "standard"}

    refused = browser.post("/oauth/device/", form)
    assert refused.status_code == 403
    to_provider = browser.post(refused.context["providers"][0][1])
    back = urlsplit(provider.approve(to_provider["Location"], other))
    landed = browser.get(f"{back.path}?{back.query}")
    assert landed.status_code == 302 and landed["Location"] == "/oauth/device/"
    assert browser.get("/").wsgi_request.user == other_person  # the other person's now
    page = browser.get("/oauth/device/")
    assert page.status_code == 200 and code not in page.content.decode()
    assert DeviceGrant.objects.get(user_code=code).status == DeviceGrant.AUTHORIZATION_PENDING
