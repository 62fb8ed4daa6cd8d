"""Signing in with a password Harness keeps (allauth's login), as before single sign-on."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.support.factories import make_user, unique

pytestmark = pytest.mark.django_db


def test_signs_in_with_username_and_password_and_lands_where_asked() -> None:
    user = make_user(unique("pw"), groups=("reviewer",))
    client = Client()
    page = client.get("/accounts/login/?next=/approvals/")
    assert page.status_code == 200
    assert b'id="password-sign-in"' in page.content
    response = client.post(
        "/accounts/login/",
        {"login": user.username, "password": "pw-" + user.username, "next": "/approvals/"},
    )
    assert response.status_code == 302 and response["Location"] == "/approvals/"
    assert client.get("/approvals/").status_code == 200


def test_a_wrong_password_is_refused_with_a_message() -> None:
    user = make_user(unique("pw"))
    response = Client().post("/accounts/login/", {"login": user.username, "password": "nope"})
    assert response.status_code == 200
    assert b"not correct" in response.content


def test_signing_out_is_a_post_and_ends_the_session() -> None:
    user = make_user(unique("pw"), groups=("reviewer",))
    client = Client()
    client.force_login(user)
    assert client.get("/accounts/logout/").status_code == 200  # a confirmation, not a sign-out
    assert client.get("/approvals/").status_code == 200
    response = client.post("/accounts/logout/")
    assert response.status_code == 302 and response["Location"] == "/accounts/login/"
    assert client.get("/approvals/").status_code == 302


@pytest.mark.parametrize(
    "path", ["/accounts/signup/", "/accounts/password/reset/", "/accounts/email/"]
)
def test_sign_up_password_reset_and_email_changes_are_not_offered(path: str) -> None:
    response = Client().get(path)
    assert response.status_code == 404
    assert b"managed by an administrator" in response.content
    assert Client().post(path, {"username": "x", "email": "x@example.com"}).status_code == 404


def test_repeated_wrong_passwords_are_slowed_down() -> None:
    user = make_user(unique("pw"))
    client = Client()
    for _ in range(5):
        client.post("/accounts/login/", {"login": user.username, "password": "nope"})
    response = client.post(
        "/accounts/login/", {"login": user.username, "password": "pw-" + user.username}
    )
    assert response.status_code in (200, 429)
    assert "Too many failed login attempts" in response.content.decode()
    assert client.get("/approvals/").status_code == 302
