"""HARNESS_SSO_ONLY: passwords open only for the break-glass accounts; such a sign-in is
audited as such and the org admins hear of it over the notification channels."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import run_checks
from django.test import Client

from approvals.models import Channel
from audit.models import AuditEvent
from identity import notify
from tests.notifications import receivers
from tests.support.factories import make_user, unique

pytestmark = pytest.mark.django_db

SECRET = "a-webhook-secret-of-some-length"
REFUSAL = "Password sign-in is off"


@pytest.fixture
def sso_only(settings: Any) -> Any:
    glass = make_user(unique("glass"), groups=("admin",))
    settings.HARNESS_SSO_ONLY = True
    settings.HARNESS_BREAK_GLASS_USERS = [glass.username]
    return glass


def password_sign_in(client: Client, username: str, password: str) -> Any:
    return client.post("/accounts/login/", {"login": username, "password": password})


def test_an_ordinary_account_cannot_sign_in_with_its_password(sso_only: Any) -> None:
    person = make_user(unique("person"), groups=("reviewer",))
    client = Client()
    response = password_sign_in(client, person.username, "pw-" + person.username)
    assert response.status_code == 200 and REFUSAL in response.content.decode()
    assert client.get("/approvals/").status_code == 302
    assert not AuditEvent.objects.filter(kind="user.break_glass").exists()


def test_a_wrong_break_glass_password_reads_the_same_as_a_closed_door(sso_only: Any) -> None:
    response = password_sign_in(Client(), sso_only.username, "wrong")
    assert REFUSAL in response.content.decode()


def test_the_admin_sign_in_is_closed_too(sso_only: Any) -> None:
    staff = make_user(unique("staff"))
    staff.is_staff = staff.is_superuser = True
    staff.save()
    client = Client()
    client.post("/admin/login/", {"username": staff.username, "password": "pw-" + staff.username})
    assert client.get("/admin/").status_code == 302


def test_break_glass_signs_in_is_audited_and_the_admins_are_told(
    sso_only: Any, django_capture_on_commit_callbacks: Any
) -> None:
    client = Client()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = password_sign_in(client, sso_only.username, "pw-" + sso_only.username)
    assert response.status_code == 302
    assert client.get("/permissions/").status_code == 200  # signed in, as an admin
    event = AuditEvent.objects.get(kind="user.break_glass", subject=f"user:{sso_only.username}")
    assert event.payload == {"user": sso_only.username, "address": "127.0.0.1"}
    assert len(callbacks) == 1  # the notice, enqueued after commit
    with receivers.webhook_receiver(SECRET) as hook:
        Channel.objects.create(
            name=unique("hook"), kind="webhook", config={"url": hook.url, "secret": SECRET}
        )
        Channel.objects.create(
            name=unique("off"),
            kind="webhook",
            enabled=False,
            config={"url": hook.url, "secret": SECRET},
        )
        from django.test import override_settings

        with override_settings(HARNESS_OUTBOUND_ALLOW=[hook.url.split("/")[2]]):
            reached = notify.notify_break_glass(event.pk)
        [received] = hook.wait_for(1)
    assert len(reached) == 1
    body = received.json()
    assert body["event"] == "user.break_glass" and body["user"] == sso_only.username
    assert body["audit_event"] == event.pk


def test_the_break_glass_notice_reaches_the_admins_by_email(sso_only: Any) -> None:
    sso_only.email = f"{sso_only.username}@example.test"
    sso_only.save()
    make_user(unique("reviewer"), groups=("reviewer",))  # not an admin: not told
    Client().post(
        "/accounts/login/", {"login": sso_only.username, "password": "pw-" + sso_only.username}
    )
    event = AuditEvent.objects.get(kind="user.break_glass", subject=f"user:{sso_only.username}")
    with receivers.smtp_server() as mailbox:
        mailers = {
            "default": {
                "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
                "OPTIONS": {"host": "127.0.0.1", "port": mailbox.port, "timeout": 5},
            }
        }
        from django.test import override_settings

        with override_settings(MAILERS=mailers):
            Channel.objects.create(
                name=unique("mail"), kind="email", config={"addresses": ["sec@example.test"]}
            )
            notify.notify_break_glass(event.pk)
    assert sorted(sum(mailbox.envelopes, [])) == sorted(["sec@example.test", sso_only.email])
    [message, *_] = mailbox.messages
    assert "Break-glass" in message["Subject"]
    assert sso_only.username in message.get_payload(decode=True).decode()


def test_without_sso_only_a_password_sign_in_is_no_break_glass(settings: Any) -> None:
    person = make_user(unique("person"))
    settings.HARNESS_BREAK_GLASS_USERS = [person.username]
    client = Client()
    assert password_sign_in(client, person.username, "pw-" + person.username).status_code == 302
    assert not AuditEvent.objects.filter(kind="user.break_glass").exists()


def test_sso_only_without_a_provider_fails_at_start_up(settings: Any) -> None:
    settings.HARNESS_SSO_ONLY = True
    settings.HARNESS_SSO = []
    ids = {m.id for m in run_checks()}
    assert "identity.E001" in ids
