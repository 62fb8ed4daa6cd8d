"""A person signs in through the browser with the organization's identity provider (a
real OpenID provider on loopback), with password sign-in closed but for break-glass."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from approvals.models import Channel
from audit.models import AuditEvent
from tests.notifications import receivers
from tests.support import oidc
from tests.support.browser import login
from tests.support.factories import make_user, unique
from tests.support.live import LiveStack
from tests.support.sso_site import daphne_with

pytestmark = [pytest.mark.browser, pytest.mark.live]

SECRET = "a-webhook-secret-of-some-length"


@pytest.fixture(scope="module")
def sso(
    tmp_path_factory: pytest.TempPathFactory, live_stack: LiveStack
) -> Iterator[tuple[str, oidc.Provider]]:
    with oidc.oidc_provider() as provider:
        env = oidc.environ(provider, name="Acme Okta") | {
            "HARNESS_SSO_ONLY": "true",
            "HARNESS_BREAK_GLASS_USERS": "glass-admin",
        }
        with daphne_with(env, tmp_path_factory.mktemp("sso")) as url:
            yield url, provider


def test_a_person_signs_in_with_the_identity_provider(
    sso: tuple[str, oidc.Provider], live_db: None, browser: Any
) -> None:
    url, provider = sso
    sub = unique("dana")
    provider.set_person(sub, email=f"{sub}@acme.test", email_verified=True, preferred_username=sub)
    page = browser.new_page()
    try:
        page.goto(f"{url}/accounts/login/")
        assert "Break-glass accounts only" in page.inner_text("main")
        page.click("text=Sign in with Acme Okta")
        page.wait_for_url(f"{provider.issuer}/oauth2/authorize*")
        page.fill("#subject-input", sub)
        page.click("form:has(#subject-input) button[type=submit]")
        page.wait_for_url(f"{url}/")
        assert page.inner_text("header a.me") == sub
        page.goto(f"{url}/accounts/sessions/")
        assert "this one" in page.inner_text("main")
    finally:
        page.close()
    connection.close()
    user = User.objects.get(username=sub)
    assert user.email == f"{sub}@acme.test"
    assert AuditEvent.objects.filter(kind="user.signed_in_sso", subject=f"user:{sub}").exists()


def test_a_password_is_refused_to_an_ordinary_account(
    sso: tuple[str, oidc.Provider], live_db: None, browser: Any
) -> None:
    url, _ = sso
    person = make_user(unique("pw"), groups=("reviewer",))
    connection.close()
    page = browser.new_page()
    try:
        login(page, url, person.username)
        assert "Password sign-in is off" in page.inner_text("main")
        assert page.url.startswith(f"{url}/accounts/login/")
    finally:
        page.close()


def test_the_break_glass_account_signs_in_it_is_audited_and_the_admins_are_told(
    sso: tuple[str, oidc.Provider], live_db: None, browser: Any
) -> None:
    """End to end: the sign-in in the browser, the audit event, and the notice delivered by
    the live Celery worker to a webhook channel on loopback."""
    url, _ = sso
    glass = User.objects.filter(username="glass-admin").first() or make_user(
        "glass-admin", groups=("admin",)
    )
    before = AuditEvent.objects.filter(kind="user.break_glass", subject="user:glass-admin").count()
    with receivers.webhook_receiver(SECRET) as hook:
        channel = Channel.objects.create(
            name=unique("glass-hook"), kind="webhook", config={"url": hook.url, "secret": SECRET}
        )
        connection.close()
        page = browser.new_page()
        try:
            login(page, url, glass.username)
            page.wait_for_url(f"{url}/")
            assert page.inner_text("header a.me") == glass.username
            [notice] = hook.wait_for(1)
        finally:
            page.close()
            Channel.objects.filter(pk=channel.pk).update(enabled=False)
            connection.close()
    events = AuditEvent.objects.filter(kind="user.break_glass", subject="user:glass-admin")
    assert events.count() == before + 1
    body = notice.json()
    assert body["event"] == "user.break_glass" and body["user"] == "glass-admin"
    assert body["audit_event"] == events.last().pk  # type: ignore[union-attr]
