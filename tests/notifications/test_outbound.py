"""Notifications through the outbound door: a reviewer's or an admin's address on
loopback is never reached, a receiver's answer body is never recorded or shown, and a
push subscription belongs to the person who made it (issue 31)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals.models import Channel, Delivery, PushSubscription
from tests.approvals.conftest import ask
from tests.notifications import receivers
from tests.notifications.test_channels import _subscription_keys, send_all
from tests.support.factories import AgentFixture, make_user, unique

pytestmark = pytest.mark.django_db

SECRET = "a-webhook-secret-of-some-length"
REMOTE_SECRET = "internal-service-token-9f8e7d"


def test_a_webhook_on_an_address_not_allowed_is_never_reached(
    settings: Any, agent: AgentFixture
) -> None:
    settings.HARNESS_OUTBOUND_ALLOW = []
    with receivers.webhook_receiver(SECRET) as server:
        port = server.url.rsplit(":", 1)[1]
        for url in (server.url + "/hook", f"http://localhost:{port}/hook"):
            Channel.objects.create(
                name=unique("inward"), kind="webhook", config={"url": url, "secret": SECRET}
            )
        approval = ask(agent, {"path": "notes.txt", "content": "x"})
        deliveries = send_all(approval)
        assert server.received == [] and server.rejected == []
    assert [d.state for d in deliveries] == [Delivery.State.FAILED] * 2
    assert {d.last_error for d in deliveries} == {"refused: a loopback address (127.0.0.1)"}


def test_a_receivers_answer_is_never_recorded_or_shown(settings: Any, agent: AgentFixture) -> None:
    def respond(server: receivers.Server, received: receivers.Received) -> tuple[int, bytes]:
        return 500, json.dumps({"debug": REMOTE_SECRET}).encode()

    with receivers.http_server(respond) as server:
        Channel.objects.create(
            name=unique("leaky"), kind="webhook", config={"url": server.url, "secret": SECRET}
        )
        [delivery] = send_all(ask(agent, {"path": "notes.txt", "content": "x"}))
    assert delivery.state == Delivery.State.FAILED
    assert delivery.last_error == "HTTP 500" and delivery.response_status == 500
    admin = Client()
    admin.force_login(make_user(unique("admin"), groups=("admin",)))
    page = admin.get("/approvals/notifications/").content.decode()
    assert "HTTP 500" in page and REMOTE_SECRET not in page


def test_web_push_to_an_endpoint_that_is_no_push_service_is_refused(
    settings: Any, reviewer: User, agent: AgentFixture
) -> None:
    from py_vapid import Vapid, b64urlencode

    vapid = Vapid()
    vapid.generate_keys()
    raw = vapid.private_key.private_numbers().private_value.to_bytes(32, "big")
    settings.HARNESS_VAPID_PRIVATE_KEY = b64urlencode(raw)
    _, keys = _subscription_keys()
    with receivers.push_service() as push:
        settings.HARNESS_OUTBOUND_ALLOW = []
        client = Client()
        client.force_login(reviewer)
        for endpoint in (push.url + "/push/abc", "https://push.example.net/p"):
            response = client.post(
                "/approvals/push/subscribe",
                json.dumps({"endpoint": endpoint, "keys": keys}),
                content_type="application/json",
            )
            assert response.status_code == 201
        Channel.objects.create(name=unique("push"), kind="webpush", config={})
        deliveries = send_all(ask(agent, {"path": "notes.txt", "content": "x"}))
        assert push.received == []
    assert sorted(d.last_error for d in deliveries) == ["refused: not a known push service"] * 2


def test_another_reviewer_registering_my_endpoint_does_not_take_my_subscription(
    reviewer: User,
) -> None:
    _, keys = _subscription_keys()
    _, other_keys = _subscription_keys()
    endpoint = "https://fcm.googleapis.com/fcm/send/reviewer-a-device"
    mine = Client()
    mine.force_login(reviewer)
    body = {"endpoint": endpoint, "keys": keys}
    assert mine.post("/approvals/push/subscribe", body, "application/json").status_code == 201
    intruder = Client()
    intruder.force_login(make_user(unique("rev-b"), groups=("reviewer",)))
    body = {"endpoint": endpoint, "keys": other_keys}
    assert intruder.post("/approvals/push/subscribe", body, "application/json").status_code == 201
    my_subscription = PushSubscription.objects.get(user=reviewer, endpoint=endpoint)
    assert my_subscription.keys == keys  # still mine, with my browser's keys
    assert PushSubscription.objects.filter(endpoint=endpoint).count() == 2
