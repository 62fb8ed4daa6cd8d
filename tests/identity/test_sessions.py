"""Sign-ins that end: idle and absolute lifetimes, signing out everywhere or one sign-in
from the person's own page, the beat ending stale sign-ins; sockets close with them."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from audit.models import AuditEvent
from identity import services
from tests.support.factories import make_user, unique

pytestmark = pytest.mark.django_db


def signed_in(user: User, agent: str = "browser-a") -> Client:
    """A browser signed in through the login page (as a person does)."""
    client = Client(headers={"user-agent": agent})
    response = client.post(
        "/accounts/login/", {"login": user.username, "password": "pw-" + user.username}
    )
    assert response.status_code == 302
    return client


def age(client: Client, *, signed_in_ago: float = 0, seen_ago: float = 0) -> None:
    session = client.session
    now = time.time()
    session[services.SIGNED_IN_AT] = now - signed_in_ago
    session[services.SEEN_AT] = now - seen_ago
    session.save()


def test_an_idle_sign_in_ends_and_says_why(settings: Any) -> None:
    settings.HARNESS_SESSION_IDLE = 600
    user = make_user(unique("rev"), groups=("reviewer",))
    client = signed_in(user)
    age(client, seen_ago=300)
    assert client.get("/approvals/").status_code == 200  # 5 minutes idle: fine
    age(client, seen_ago=601)
    response = client.get("/approvals/", follow=True)
    assert response.redirect_chain[-1][0].startswith("/accounts/login/")
    assert "You were signed out: idle for more than 10 minutes." in response.content.decode()
    event = AuditEvent.objects.get(kind="user.session_expired", subject=f"user:{user.username}")
    assert event.payload["reason"] == "idle for more than 10 minutes"
    assert event.actor == "harness"


def test_a_sign_in_ends_at_its_absolute_lifetime_however_busy(settings: Any) -> None:
    settings.HARNESS_SESSION_MAX_AGE = 3600
    user = make_user(unique("rev"), groups=("reviewer",))
    client = signed_in(user)
    age(client, signed_in_ago=3601, seen_ago=1)
    assert client.get("/approvals/").status_code == 302
    assert AuditEvent.objects.get(kind="user.session_expired").payload["reason"] == (
        "signed in more than 1 hour ago"
    )


def test_the_own_page_lists_the_sign_ins_and_signs_out_everywhere() -> None:
    user = make_user(unique("rev"), groups=("reviewer",))
    first, second = signed_in(user, "browser-a"), signed_in(user, "browser-b")
    other = signed_in(make_user(unique("other"), groups=("reviewer",)))
    page = first.get("/accounts/sessions/").content.decode()
    assert "browser-a" in page and "browser-b" in page and "this one" in page
    response = first.post("/accounts/sessions/everywhere/")
    assert response.status_code == 302 and response["Location"] == "/accounts/login/"
    assert first.get("/approvals/").status_code == 302
    assert second.get("/approvals/").status_code == 302
    assert other.get("/approvals/").status_code == 200  # someone else's stays
    event = AuditEvent.objects.get(
        kind="user.signed_out_everywhere", subject=f"user:{user.username}"
    )
    assert event.payload["sign_ins"] == 2


def test_one_sign_in_ends_from_another() -> None:
    from allauth.usersessions.models import UserSession

    user = make_user(unique("rev"), groups=("reviewer",))
    first, second = signed_in(user, "browser-a"), signed_in(user, "browser-b")
    row = UserSession.objects.get(user=user, user_agent="browser-b")
    assert first.post(f"/accounts/sessions/{row.pk}/end/").status_code == 302
    assert second.get("/approvals/").status_code == 302
    assert first.get("/approvals/").status_code == 200
    intruder = signed_in(make_user(unique("x")))
    other_row = UserSession.objects.get(user=user, user_agent="browser-a")
    assert intruder.post(f"/accounts/sessions/{other_row.pk}/end/").status_code == 404
    assert first.get("/approvals/").status_code == 200


def test_the_beat_ends_sign_ins_nobody_uses_any_more(settings: Any) -> None:
    settings.HARNESS_SESSION_IDLE = 600
    user = make_user(unique("rev"), groups=("reviewer",))
    client = signed_in(user)
    assert services.end_stale_sign_ins(now=time.time() + 60) == 0
    assert services.end_stale_sign_ins(now=time.time() + 601) >= 1
    age(client)  # its own clock says fresh: the session itself is gone
    assert client.get("/approvals/").status_code == 302
