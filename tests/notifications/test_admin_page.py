"""The admin page: channels configured and audited, deliveries listed, admins only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from approvals.models import Channel
from audit.models import AuditEvent
from tests.support.factories import make_user, unique

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin() -> Client:
    client = Client()
    client.force_login(make_user(unique("admin"), groups=("admin",)))
    return client


def test_only_admins_see_the_page() -> None:
    reviewer = Client()
    reviewer.force_login(make_user(unique("rev"), groups=("reviewer",)))
    assert reviewer.get("/approvals/notifications/").status_code == 403
    assert Client().get("/approvals/notifications/").status_code == 302


def test_an_admin_adds_a_routed_webhook_channel_audited_with_the_secret_hidden(
    admin: Client,
) -> None:
    Group.objects.create(name="sre-oncall")
    response = admin.post(
        "/approvals/notifications/",
        {
            "name": "ops hook",
            "kind": "webhook",
            "url": "https://hooks.example.test/harness",
            "secret": "s3cret-s3cret-s3cret",
            "match_tools": "run_command, delete_file",
            "match_rules": "run_command(terraform apply *)",
            "groups": "sre-oncall",
        },
    )
    assert response.status_code == 302
    channel = Channel.objects.get(name="ops hook")
    assert channel.match_tools == ["run_command", "delete_file"]
    assert list(channel.groups.values_list("name", flat=True)) == ["sre-oncall"]
    event = AuditEvent.objects.get(
        kind="notification.channel_changed", subject=f"channel:{channel.pk}"
    )
    assert "s3cret" not in str(event.payload)
    page = admin.get("/approvals/notifications/").content.decode()
    assert "ops hook" in page and "s3cret" not in page
    # Changing it with the secret left blank keeps the secret.
    admin.post(
        "/approvals/notifications/",
        {
            "channel_id": channel.pk,
            "name": "ops hook",
            "kind": "webhook",
            "url": "https://hooks.example.test/v2",
        },
    )
    channel.refresh_from_db()
    assert channel.config == {
        "url": "https://hooks.example.test/v2",
        "secret": "s3cret-s3cret-s3cret",
    }
    admin.post(f"/approvals/notifications/{channel.pk}/toggle")
    channel.refresh_from_db()
    assert not channel.enabled


def test_a_bad_channel_is_refused_naming_each_problem(admin: Client) -> None:
    response = admin.post(
        "/approvals/notifications/",
        {"name": "x", "kind": "webhook", "url": "ftp://nope", "secret": "short", "users": "ghost"},
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "must be an http(s) URL" in page and "at least 16 characters" in page
    assert "No user named &#x27;ghost&#x27;" in page
    assert not Channel.objects.filter(name="x").exists()
