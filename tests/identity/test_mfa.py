"""Second factors: HARNESS_MFA_REQUIRED sends the people it names to set one up before any
other page; a person's page lists their passkeys and other factors."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.test import Client, override_settings

from tests.support.factories import make_user, unique
from tests.support.passkeys import SoftPasskey

pytestmark = pytest.mark.django_db


def signed_in(*roles: str) -> tuple[Client, object]:
    user = make_user(unique("p"), groups=roles)
    client = Client()
    client.force_login(user)
    return client, user


@override_settings(HARNESS_MFA_REQUIRED="reviewers")
def test_a_reviewer_without_a_factor_is_sent_to_set_one_up_first() -> None:
    client, user = signed_in("reviewer")
    queue = client.get("/approvals/")
    assert queue.status_code == 302
    assert queue["Location"] == "/accounts/second-factor/?next=%2Fapprovals%2F"
    page = client.get(queue["Location"]).content.decode()
    assert "Your role requires a second factor" in page and "Add a passkey" in page
    # A decision cannot slip past the page either.
    assert client.post("/approvals/1/decide", {"action": "deny"}).status_code == 403
    # Signing out and the factor pages stay open.
    assert client.get("/accounts/2fa/webauthn/add/").status_code in (200, 302)
    SoftPasskey().register(user, "laptop")  # type: ignore[arg-type]
    assert client.get("/approvals/").status_code == 200
    done = client.get("/accounts/second-factor/?next=/approvals/").content.decode()
    assert "Your account has a second factor." in done and 'href="/approvals/"' in done


@override_settings(HARNESS_MFA_REQUIRED="reviewers")
def test_the_set_up_page_never_sends_a_person_elsewhere() -> None:
    client, user = signed_in("reviewer")
    SoftPasskey().register(user)  # type: ignore[arg-type]
    page = client.get("/accounts/second-factor/?next=https://evil.example/").content.decode()
    assert "evil.example" not in page


@pytest.mark.parametrize(
    ("level", "roles", "sent"),
    [
        ("none", ("admin",), False),
        ("admins", ("reviewer",), False),
        ("admins", ("admin",), True),
        ("reviewers", (), False),
        ("reviewers", ("admin",), True),
        ("all", (), True),
    ],
)
def test_the_level_names_who_must_have_a_factor(
    level: str, roles: tuple[str, ...], sent: bool
) -> None:
    client, _ = signed_in(*roles)
    with override_settings(HARNESS_MFA_REQUIRED=level):
        response = client.get("/")
    assert (response.status_code == 302 and "second-factor" in response["Location"]) is sent


def test_an_unknown_level_fails_at_start_up() -> None:
    with override_settings(HARNESS_MFA_REQUIRED="sometimes"):
        errors = [e for e in run_checks() if e.id == "identity.E101"]
    assert errors and "none, admins, reviewers, all" in str(errors[0].hint)


def test_a_persons_page_lists_their_passkeys() -> None:
    client, user = signed_in("reviewer")
    page = client.get("/accounts/me/").content.decode()
    assert "No passkey yet." in page
    SoftPasskey().register(user, "YubiKey 5C")  # type: ignore[arg-type]
    page = client.get("/accounts/me/").content.decode()
    assert "YubiKey 5C" in page and "No passkey yet." not in page
    assert Client().get("/accounts/me/").status_code == 302  # signed in only


def password_sign_in(username: str) -> tuple[Client, object]:
    client = Client()
    response = client.post("/accounts/login/", {"login": username, "password": "pw-" + username})
    return client, response


def test_an_authenticator_app_and_recovery_codes_complete_a_password_sign_in() -> None:
    from allauth.mfa.recovery_codes.internal.auth import RecoveryCodes
    from allauth.mfa.totp.internal.auth import (
        TOTP,
        format_hotp_value,
        generate_totp_secret,
        hotp_value,
        yield_hotp_counters_from_time,
    )

    user = make_user(unique("p"), groups=("reviewer",))
    secret = generate_totp_secret()
    TOTP.activate(user, secret)
    codes = RecoveryCodes.activate(user).get_unused_codes()
    client, response = password_sign_in(user.username)
    assert response["Location"] == "/accounts/2fa/authenticate/"  # type: ignore[index]
    assert client.get("/approvals/").status_code == 302  # not signed in yet
    wrong = client.post("/accounts/2fa/authenticate/", {"code": "000000"})
    assert wrong.status_code == 200 and "Incorrect code" in wrong.content.decode()
    code = format_hotp_value(hotp_value(secret, next(yield_hotp_counters_from_time())))
    done = client.post("/accounts/2fa/authenticate/", {"code": code})
    assert done.status_code == 302 and client.get("/approvals/").status_code == 200
    # A recovery code works once, in place of the app.
    again, _ = password_sign_in(user.username)
    assert again.post("/accounts/2fa/authenticate/", {"code": codes[0]}).status_code == 302
    assert again.get("/approvals/").status_code == 200
    third, _ = password_sign_in(user.username)
    assert third.post("/accounts/2fa/authenticate/", {"code": codes[0]}).status_code == 200
    page = third.get("/accounts/me/")
    assert page.status_code == 302  # still not signed in


@pytest.mark.django_db(transaction=True)  # the socket's thread reads committed rows
def test_no_live_socket_before_the_factor_is_set_up() -> None:
    from tests.approvals.conftest import open_socket, run_async, session_cookie

    client, user = signed_in("reviewer")
    cookie = (b"cookie", session_cookie(client))
    origin = (b"origin", b"http://127.0.0.1")

    def connects() -> bool:
        async def attempt() -> bool:
            communicator, connected = await open_socket(cookie, origin)
            await communicator.disconnect()
            return connected

        return run_async(attempt)

    with override_settings(HARNESS_MFA_REQUIRED="reviewers"):
        assert connects() is False
        SoftPasskey().register(user)  # type: ignore[arg-type]
        assert connects() is True
    assert connects() is True
