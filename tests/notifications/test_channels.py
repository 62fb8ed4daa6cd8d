"""Each channel against a receiver on loopback: what it sends, signed, escaped, and
the second event when the call is decided."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

from approvals import services as approvals
from approvals.models import ApprovalRequest, Channel, Delivery, PushSubscription
from approvals.notifications import senders
from approvals.notifications import services as notifications
from tests.approvals.conftest import ask
from tests.notifications import receivers
from tests.support.factories import AgentFixture, make_user, unique

pytestmark = pytest.mark.django_db

SECRET = "a-webhook-secret-of-some-length"
HOSTILE = "<!channel> <https://evil.example|click> ``` & done"


def channel(kind: str, config: dict[str, Any], **fields: Any) -> Channel:
    return Channel.objects.create(name=unique(kind), kind=kind, config=config, **fields)


def send_all(approval: ApprovalRequest) -> list[Delivery]:
    ids = notifications.plan_ask(approval.pk)
    for delivery_id in ids:
        with contextlib.suppress(senders.DeliveryFailed):
            notifications.deliver(delivery_id)
    return list(Delivery.objects.filter(pk__in=ids))


def decide_and_send(approval: ApprovalRequest, reviewer: User, approve: bool = True) -> None:
    approvals.decide(
        approval_id=approval.pk, user=reviewer, approve=approve, digest=approval.call.digest
    )
    for delivery_id in notifications.plan_outcome(approval.pk):
        notifications.deliver(delivery_id)


def test_webhook_body_is_signed_with_a_timestamp_and_carries_links_per_reviewer(
    reviewer: User, agent: AgentFixture
) -> None:
    with receivers.webhook_receiver(SECRET) as server:
        channel("webhook", {"url": server.url + "/hook", "secret": SECRET})
        approval = ask(agent, {"path": "notes.txt", "content": HOSTILE})
        [delivery] = send_all(approval)
        assert delivery.state == Delivery.State.SENT and delivery.response_status == 200
        [received] = server.wait_for(1)
        body = received.json()
        assert body["event"] == "approval.asked"
        assert body["call"]["arguments"] == approval.call.raw_arguments  # as logged
        assert body["call"]["digest"] == approval.call.digest
        assert body["why"] == approval.reason and body["call"]["tool"] == "write_file"
        mine = [link for link in body["links"] if link["reviewer"] == reviewer.username]
        assert mine and "/approvals/links/" in mine[0]["approve"]
        # The receiver's check passes, and fails for another body or an old timestamp.
        assert receivers.verify_webhook(SECRET, received.headers, received.body) is None
        assert receivers.verify_webhook(SECRET, received.headers, received.body + b" ") is not None
        old = {**received.headers, "x-harness-timestamp": str(int(time.time()) - 3600)}
        assert receivers.verify_webhook(SECRET, old, received.body) == "stale or missing timestamp"

        decide_and_send(approval, reviewer)
        decided = server.wait_for(2)[1].json()
        assert decided["event"] == "approval.decided"
        assert decided["outcome"]["status"] == "queued"
        assert decided["outcome"]["decided_by"] == reviewer.username


def test_a_receiver_refusing_the_signature_is_a_failed_delivery_retried_later(
    agent: AgentFixture,
) -> None:
    with receivers.webhook_receiver(SECRET) as server:
        channel("webhook", {"url": server.url, "secret": "another-secret-entirely"})
        approval = ask(agent, {"path": "notes.txt", "content": "x"})
        [delivery] = send_all(approval)
        assert delivery.state == Delivery.State.FAILED and delivery.attempts == 1
        assert "HTTP 401" in delivery.last_error
        assert server.rejected == ["bad signature"]
    # The call itself is untouched by the failing channel.
    approval.call.refresh_from_db()
    assert approval.call.status == "pending_approval"


@pytest.mark.heavy
def test_a_failing_receiver_is_retried_until_it_answers_then_gives_up_after_max(
    agent: AgentFixture,
) -> None:
    with receivers.webhook_receiver(SECRET) as server:
        channel("webhook", {"url": server.url, "secret": SECRET})
        approval = ask(agent, {"path": "notes.txt", "content": "x"})
        server.fail_next = 2
        [delivery_id] = notifications.plan_ask(approval.pk)
        for _ in range(2):
            with pytest.raises(senders.DeliveryFailed):
                notifications.deliver(delivery_id)
        notifications.deliver(delivery_id)
        delivery = Delivery.objects.get(pk=delivery_id)
        assert (delivery.state, delivery.attempts) == (Delivery.State.SENT, 3)
        assert len(server.received) == 1
    dead = channel("webhook", {"url": "http://127.0.0.1:9/none", "secret": SECRET})
    approval = ask(agent, {"path": "other.txt", "content": "y"}, call_id="w2")
    [delivery_id] = [
        d for d in notifications.plan_ask(approval.pk) if Delivery.objects.get(pk=d).channel == dead
    ]
    for _ in range(notifications.MAX_ATTEMPTS - 1):
        with pytest.raises(senders.DeliveryFailed):
            notifications.deliver(delivery_id)
    notifications.deliver(delivery_id)  # the last attempt records and stops raising
    assert Delivery.objects.get(pk=delivery_id).state == Delivery.State.GAVE_UP


def test_slack_bot_posts_block_kit_escaped_and_updates_the_message_when_decided(
    reviewer: User, agent: AgentFixture
) -> None:
    with receivers.fake_slack() as slack:
        channel(
            "slack",
            {"bot_token": "xoxb-test-token", "channel": "C123", "api_url": slack.url + "/api/"},
        )
        approval = ask(agent, {"argv": ["terraform", "apply", HOSTILE]}, name="run_command")
        [delivery] = send_all(approval)
        assert delivery.state == Delivery.State.SENT, delivery.last_error
        [posted] = slack.wait_for(1)
        assert posted.path == "/api/chat.postMessage"
        form = receivers.slack_form(posted)
        text = json.dumps(form["blocks"])
        assert "<!channel>" not in text and "<https://evil.example" not in text
        assert "&lt;!channel&gt;" in text and "terraform" in text
        buttons = [b for b in form["blocks"] if b["type"] == "actions"][0]["elements"]
        assert any(reviewer.username in b["text"]["text"] for b in buttons)
        assert delivery.external["ts"]

        decide_and_send(approval, reviewer, approve=False)
        update = slack.wait_for(2)[1]
        assert update.path == "/api/chat.update"
        updated = receivers.slack_form(update)
        assert updated["ts"] == delivery.external["ts"]
        assert f"Now denied by {reviewer.username}" in json.dumps(updated["blocks"])


def test_slack_incoming_webhook_gets_the_diff(agent: AgentFixture) -> None:
    with receivers.fake_slack() as slack:
        channel("slack", {"webhook_url": slack.url + "/services/hook"})
        approval = ask(agent, {"path": "notes.txt", "content": "new line\n"})
        [delivery] = send_all(approval)
        assert delivery.state == Delivery.State.SENT, delivery.last_error
        body = slack.wait_for(1)[0].json()
        assert "+new line" in json.dumps(body["blocks"])


def test_email_reaches_a_real_smtp_server_with_the_recipients_own_links(
    agent: AgentFixture,
) -> None:
    person = make_user(unique("mailed"), groups=("reviewer",))
    person.email = f"{person.username}@example.test"
    person.save()
    with receivers.smtp_server() as mailbox:
        with receivers.mailers_for(mailbox):
            channel("email", {"addresses": ["oncall@example.test"]}, source="x").users.add(person)
            approval = ask(agent, {"path": "notes.txt", "content": "hello"})
            deliveries = send_all(approval)
        assert {d.state for d in deliveries} == {Delivery.State.SENT}
        assert sorted(sum(mailbox.envelopes, [])) == sorted(["oncall@example.test", person.email])
        by_to = {m["To"]: m for m in mailbox.messages}
        mine = by_to[person.email].get_payload(decode=True).decode()
        assert "/approvals/links/" in mine and approval.call.digest in mine
        assert "+hello" in mine
        other = by_to["oncall@example.test"].get_payload(decode=True).decode()
        assert "/approvals/links/" not in other  # an address that is nobody: no links
        assert "[Harness]" in by_to[person.email]["Subject"]


def _subscription_keys() -> tuple[Any, dict[str, str]]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private = ec.generate_private_key(ec.SECP256R1())
    public = private.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    auth = os.urandom(16)

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    return (private, auth), {"p256dh": b64(public), "auth": b64(auth)}


def test_web_push_posts_an_encrypted_payload_with_vapid_to_the_push_service(
    reviewer: User, agent: AgentFixture
) -> None:
    import http_ece
    from py_vapid import Vapid, b64urlencode

    vapid = Vapid()
    vapid.generate_keys()
    raw = vapid.private_key.private_numbers().private_value.to_bytes(32, "big")
    (private, auth), keys = _subscription_keys()
    with (
        receivers.push_service() as push,
        override_settings(HARNESS_VAPID_PRIVATE_KEY=b64urlencode(raw)),
    ):
        client = Client()
        client.force_login(reviewer)
        response = client.post(
            "/approvals/push/subscribe",
            json.dumps({"endpoint": push.url + "/push/abc", "keys": keys}),
            content_type="application/json",
        )
        assert response.status_code == 201
        assert PushSubscription.objects.get(user=reviewer).endpoint.endswith("/push/abc")
        channel("webpush", {})
        approval = ask(agent, {"path": "notes.txt", "content": "x"})
        deliveries = send_all(approval)
        assert [d.state for d in deliveries] == [Delivery.State.SENT]
        [posted] = push.wait_for(1)
    assert posted.headers["content-encoding"] == "aes128gcm"
    assert posted.headers["authorization"].startswith("vapid t=")
    plain = http_ece.decrypt(
        posted.body, private_key=private, auth_secret=auth, version="aes128gcm"
    )
    payload = json.loads(plain)
    assert payload["title"].endswith("asks to run write_file")
    assert "/approvals/links/" in payload["approve"] and "/approvals/links/" in payload["deny"]


def test_routing_by_tool_and_group(agent: AgentFixture) -> None:
    from django.contrib.auth.models import Group

    group = Group.objects.create(name=unique("oncall"))
    member = make_user(unique("member"), groups=("reviewer",))
    member.groups.add(group)
    make_user(unique("outsider"), groups=("reviewer",))
    with receivers.webhook_receiver(SECRET) as server:
        commands = channel(
            "webhook", {"url": server.url, "secret": SECRET}, match_tools=["run_command"]
        )
        commands.groups.add(group)
        write = ask(agent, {"path": "notes.txt", "content": "x"})
        assert send_all(write) == []  # a write_file ask does not match the channel
        command = ask(agent, {"argv": ["make"]}, name="run_command", call_id="c1")
        send_all(command)
        body = server.wait_for(1)[0].json()
    assert [link["reviewer"] for link in body["links"]] == [member.username]


@override_settings(HARNESS_WEBHOOK_URL="http://127.0.0.1:9/none", HARNESS_WEBHOOK_SECRET=SECRET)
def test_the_environment_creates_a_channel_for_every_ask_to_every_reviewer() -> None:
    notifications.sync_env_channels()
    env = Channel.objects.get(source="HARNESS_WEBHOOK_URL")
    assert env.enabled and env.config == {"url": "http://127.0.0.1:9/none", "secret": SECRET}
    assert not env.match_tools and not env.users.exists()
    with override_settings(HARNESS_WEBHOOK_URL=""):
        notifications.sync_env_channels()
    env.refresh_from_db()
    assert not env.enabled
