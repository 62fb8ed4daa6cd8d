"""Red team (rtstep2): a passkey's answer that cannot be read, on the pages that take one.

allauth.mfa reads a WebAuthn credential with fido2 and catches only some of what fido2
raises for a field missing or of the wrong kind: "Sign in with a passkey" (open to anyone)
and "Add a passkey" answered 500. identity.passkeys' forms refuse it with a message.
Real HTTP, CSRF checks enforced.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from allauth.mfa.models import Authenticator
from django.contrib.messages import get_messages
from django.test import Client
from django.utils.html import escape

from identity.passkeys import UNREADABLE
from tests.redteam.test_rtstep_attacks import keyed_reviewer, own_page, post
from tests.support.factories import make_user, unique

pytestmark = pytest.mark.django_db

NO_RAW_ID = {
    "id": "AA",
    "type": "public-key",
    "response": {
        "clientDataJSON": "e30",
        "authenticatorData": "AAAA",
        "signature": "AA",
        "userHandle": "MQ",
    },
}
REGISTRATIONS = [
    {
        "id": "AA",
        "rawId": "AA",
        "type": "public-key",
        "response": {"clientDataJSON": "e30", "attestationObject": "AAAA"},
    },
    {
        "id": "AA",
        "rawId": "AA",
        "type": "public-key",
        "response": {"clientDataJSON": "!!", "attestationObject": "!!"},
    },
    {
        "id": 5,
        "rawId": None,
        "type": "public-key",
        "response": {"clientDataJSON": 3, "attestationObject": []},
    },
]


@pytest.mark.parametrize("credential", [NO_RAW_ID, {**NO_RAW_ID, "rawId": "AA", "response": []}])
def test_a_passkey_sign_in_that_cannot_be_read_is_refused_not_a_500(credential: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.raise_request_exception = False
    client.get("/accounts/login/")
    answer = post(client, "/accounts/2fa/webauthn/login/", {"credential": json.dumps(credential)})
    assert answer.status_code == 302 and answer["Location"] == "/accounts/login/"
    assert UNREADABLE in [str(m) for m in get_messages(answer.wsgi_request)]


@pytest.mark.parametrize("credential", REGISTRATIONS)
def test_a_passkey_to_add_that_cannot_be_read_is_refused_not_a_500(
    settings: Any, credential: Any
) -> None:
    settings.MFA_WEBAUTHN_ALLOW_INSECURE_ORIGIN = True
    person = make_user(unique("m"), groups=("reviewer",))
    client = own_page(person)
    client.raise_request_exception = False
    assert client.get("/accounts/2fa/webauthn/add/").status_code == 200
    answer = post(
        client, "/accounts/2fa/webauthn/add/", {"name": "k", "credential": json.dumps(credential)}
    )
    assert answer.status_code == 200 and escape(UNREADABLE) in answer.content.decode()
    assert not Authenticator.objects.filter(user=person).exists()


def test_a_second_factor_or_reauthentication_answer_that_cannot_be_read_is_refused() -> None:
    """The passkey asked after the password (the 2FA stage of a person with a passkey), and
    asked again before a sensitive page (reauthentication): refused, not a 500."""
    person, signed_in, _ = keyed_reviewer()
    signed_in.raise_request_exception = False
    assert signed_in.get("/accounts/2fa/webauthn/reauthenticate/").status_code == 200
    again = post(
        signed_in,
        "/accounts/2fa/webauthn/reauthenticate/",
        {"credential": json.dumps(NO_RAW_ID)},
    )
    assert again.status_code == 302  # (allauth sends a failed passkey back with a message)
    assert UNREADABLE in [str(m) for m in get_messages(again.wsgi_request)]
    client = Client(enforce_csrf_checks=True)
    client.raise_request_exception = False
    client.get("/accounts/login/")
    password = "pw-" + person.get_username()
    login = post(client, "/accounts/login/", {"login": person.username, "password": password})
    assert login["Location"] == "/accounts/2fa/authenticate/"
    assert client.get("/accounts/2fa/authenticate/").status_code == 200
    answer = post(client, "/accounts/2fa/authenticate/", {"credential": json.dumps(NO_RAW_ID)})
    assert answer.status_code == 200
    assert client.get("/accounts/me/").status_code == 302  # not signed in
