"""Approving an agent (OAuth consent, a device code) needs a sign-in, or a confirmation
of who the person is (allauth's reauthentication), in the last 5 minutes: a browser
session someone took over cannot mint an agent token that outlives it."""

from __future__ import annotations

import time
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client
from oauth2_provider.models import DeviceGrant, Grant

from agentauth.models import AgentClient
from teams.models import Team
from tests.support.factories import make_user, unique
from tests.support.oauth import (
    REDIRECT,
    DocumentServer,
    authorize_params,
    code_from,
    consent,
    documents,
    just_signed_in,
    member,
    no_wrong_codes_counted,
    pending_device_code,
    pkce,
    signed_in,
)

pytestmark = pytest.mark.django_db
__all__ = ["documents", "no_wrong_codes_counted"]  # the fixtures (tests/support/oauth.py)


def _device_form(person: User, code: str) -> dict[str, str]:
    team = Team.objects.filter(memberships__user=person).first()
    assert team is not None
    return {"user_code": code, "action": "accept", "team": str(team.pk), "mode": "standard"}


def _status(code: str) -> str:
    return str(DeviceGrant.objects.get(user_code=code).status)


def test_a_session_signed_in_long_ago_confirms_with_its_password_before_consent(
    documents: DocumentServer,
) -> None:
    person = member()
    client_id = documents.client(f"/{unique('c')}.json", [REDIRECT])
    _, challenge = pkce()
    params = authorize_params(client_id, challenge)
    browser = signed_in(person, recently=False)  # force_login: no sign-in allauth saw
    answer = consent(browser, params)  # the page shows; allowing does not go through
    assert answer.status_code == 302
    where = urlsplit(answer["Location"])
    assert where.path == "/accounts/reauthenticate/"
    back = parse_qs(where.query)["next"][0]
    assert urlsplit(back).path == "/oauth/authorize/"
    assert parse_qs(urlsplit(back).query)["client_id"] == [client_id]
    assert not AgentClient.objects.filter(owner=person).exists()
    assert not Grant.objects.filter(user=person).exists()
    # Denying needs no confirmation.
    denied = browser.post("/oauth/authorize/", {**params, "scope": "mcp"})
    assert denied.status_code == 302 and "error=access_denied" in denied["Location"]

    wrong = browser.post(answer["Location"], {"password": "not-it"})
    assert wrong.status_code == 200 and not AgentClient.objects.filter(owner=person).exists()
    confirmed = browser.post(answer["Location"], {"password": "pw-" + person.username})
    assert confirmed.status_code == 302 and confirmed["Location"] == back
    query = code_from(consent(browser, params))
    assert query["state"] == ["st-1"] and query["code"]
    assert AgentClient.objects.filter(owner=person).count() == 1


def test_a_session_signed_in_long_ago_confirms_before_approving_a_device() -> None:
    person = member()
    code = pending_device_code()
    browser = signed_in(person, recently=False)
    assert browser.get("/oauth/device/").status_code == 200
    answer = browser.post("/oauth/device/", _device_form(person, code))
    assert answer.status_code == 302
    assert answer["Location"] == "/accounts/reauthenticate/?next=%2Foauth%2Fdevice%2F"
    assert _status(code) == DeviceGrant.AUTHORIZATION_PENDING
    assert not AgentClient.objects.filter(owner=person).exists()
    # The password confirms it, and the approval it interrupted goes through.
    done = browser.post(answer["Location"], {"password": "pw-" + person.username})
    assert done.status_code == 200, done.content[:500]
    assert "Approved: the device now acts as your agent" in done.content.decode()
    assert _status(code) == DeviceGrant.AUTHORIZED
    assert AgentClient.objects.get(owner=person).registered_via == "device"


def test_a_sign_in_through_the_form_approves_at_once_and_not_after_five_minutes() -> None:
    person = member()
    browser = Client()
    signed = browser.post(
        "/accounts/login/", {"login": person.username, "password": "pw-" + person.username}
    )
    assert signed.status_code == 302
    code = pending_device_code()
    done = browser.post("/oauth/device/", _device_form(person, code))
    assert done.status_code == 200 and _status(code) == DeviceGrant.AUTHORIZED
    # Five minutes on, the same session confirms again.
    session = browser.session
    records = session["account_authentication_methods"]
    session["account_authentication_methods"] = [{**r, "at": time.time() - 301} for r in records]
    session.save()
    later = pending_device_code()
    again = browser.post("/oauth/device/", _device_form(person, later))
    assert again.status_code == 302 and again["Location"].startswith("/accounts/reauthenticate/")
    assert _status(later) == DeviceGrant.AUTHORIZATION_PENDING


def test_an_account_without_a_password_confirms_with_its_authenticator_app() -> None:
    from allauth.mfa.totp.internal.auth import (
        TOTP,
        format_hotp_value,
        generate_totp_secret,
        hotp_value,
        yield_hotp_counters_from_time,
    )

    person = member()
    person.set_unusable_password()  # signed up through single sign-on
    person.save()
    secret = generate_totp_secret()
    TOTP.activate(person, secret)
    code = pending_device_code()
    browser = signed_in(person, recently=False)
    answer = browser.post("/oauth/device/", _device_form(person, code))
    assert answer.status_code == 302
    assert answer["Location"].startswith("/accounts/2fa/reauthenticate/?next=")
    assert _status(code) == DeviceGrant.AUTHORIZATION_PENDING
    totp = format_hotp_value(hotp_value(secret, next(yield_hotp_counters_from_time())))
    done = browser.post(answer["Location"], {"code": totp})
    assert done.status_code == 200, done.content[:500]
    assert _status(code) == DeviceGrant.AUTHORIZED


def test_an_account_with_nothing_to_confirm_with_signs_in_again() -> None:
    """Single sign-on only, no password, no second factor: nothing to confirm with here,
    so a sign-in older than 5 minutes is told to sign in again; a fresh one approves."""
    person = member()
    person.set_unusable_password()
    person.save()
    code = pending_device_code()
    old = signed_in(person, recently=False)
    refused = old.post("/oauth/device/", _device_form(person, code))
    assert refused.status_code == 403
    assert "Sign in again to approve an agent" in refused.content.decode()
    assert _status(code) == DeviceGrant.AUTHORIZATION_PENDING
    fresh = signed_in(person, recently=False)
    just_signed_in(fresh, person, method="socialaccount")
    done = fresh.post("/oauth/device/", _device_form(person, code))
    assert done.status_code == 200 and _status(code) == DeviceGrant.AUTHORIZED


def test_another_persons_sign_in_record_does_not_count() -> None:
    """allauth's records name the user they are for: a record of someone else's sign-in
    left in the session is none of this person's."""
    person, other = member(), make_user(unique("other"))
    code = pending_device_code()
    browser = signed_in(person, recently=False)
    just_signed_in(browser, other)
    answer = browser.post("/oauth/device/", _device_form(person, code))
    assert answer.status_code == 302 and _status(code) == DeviceGrant.AUTHORIZATION_PENDING


def test_an_account_without_a_password_confirms_with_its_passkey() -> None:
    """Signed up through single sign-on, a passkey added: the passkey confirms."""
    import json

    from fido2.utils import websafe_decode

    from tests.support.passkeys import SoftPasskey

    person = member()
    person.set_unusable_password()
    person.save()
    key = SoftPasskey(rp_id="localhost", origin="http://localhost")  # WebAuthn over http
    key.register(person)
    code = pending_device_code()
    browser = Client(HTTP_HOST="localhost")
    browser.force_login(person)
    answer = browser.post("/oauth/device/", _device_form(person, code))
    assert answer.status_code == 302
    assert urlsplit(answer["Location"]).path == "/accounts/2fa/webauthn/reauthenticate/"
    assert _status(code) == DeviceGrant.AUTHORIZATION_PENDING
    page = browser.get(answer["Location"])
    options = page.context["js_data"]["request_options"]
    challenge = websafe_decode(options["publicKey"]["challenge"])
    done = browser.post(answer["Location"], {"credential": json.dumps(key.assertion(challenge))})
    assert done.status_code == 200, done.content[:500]
    assert _status(code) == DeviceGrant.AUTHORIZED
