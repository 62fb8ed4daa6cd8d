"""The whole path with a real daphne and Celery worker: an ask reaches a webhook after
commit, a failing receiver is retried, the decision sends a second event, and a slow
receiver never holds up the agent's answer."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.test import Client

from approvals.models import ApprovalRequest, Channel, Delivery
from tests.notifications import receivers
from tests.support.factories import AgentFixture, make_user, unique
from tests.support.live import LiveStack

pytestmark = pytest.mark.live

SECRET = "live-webhook-secret-0123456789"


@pytest.fixture
def webhook(live_db: None) -> Iterator[tuple[receivers.Server, Channel]]:
    with receivers.webhook_receiver(SECRET) as server:
        channel = Channel.objects.create(
            name=unique("live-hook"), kind="webhook", config={"url": server.url, "secret": SECRET}
        )
        yield server, channel
        Channel.objects.filter(pk=channel.pk).update(enabled=False)


def submit(stack: LiveStack, fx: AgentFixture, path: str) -> tuple[dict[str, object], float]:
    with stack.client(fx) as client:
        session = client.post("/api/v1/sessions", json={}).json()["id"]
        body = {
            "calls": [
                {"id": "n1", "name": "write_file", "arguments": {"path": path, "content": "x"}}
            ]
        }
        started = time.monotonic()
        response = client.post(f"/api/v1/sessions/{session}/calls", json=body)
        elapsed = time.monotonic() - started
    assert response.status_code == 202
    return response.json()["calls"][0], elapsed


def wait_for_state(channel: Channel, event: str, state: str) -> Delivery:
    deadline = time.monotonic() + 10
    while True:
        delivery = Delivery.objects.get(channel=channel, event=event)
        if delivery.state == state or time.monotonic() > deadline:
            assert delivery.state == state, delivery.last_error
            return delivery
        time.sleep(0.05)


def test_an_ask_is_delivered_retried_and_followed_by_its_outcome(
    live_stack: LiveStack, live_agent: AgentFixture, webhook: tuple[receivers.Server, Channel]
) -> None:
    server, channel = webhook
    server.fail_next = 1  # the first attempt fails: the worker retries with backoff
    call, _ = submit(live_stack, live_agent, "live.txt")
    [received] = server.wait_for(1, seconds=30)
    asked = received.json()
    assert asked["event"] == "approval.asked" and asked["call"]["id"] == call["id"]
    delivery = wait_for_state(channel, "asked", Delivery.State.SENT)
    assert delivery.attempts == 2

    approval = ApprovalRequest.objects.get(call_id=call["id"])
    person = make_user(unique("rev"), groups=("reviewer",))
    client = Client()
    client.force_login(person)
    client.post(f"/approvals/{approval.pk}/decide", {"action": "deny", "digest": call["digest"]})
    decided = server.wait_for(2, seconds=30)[1].json()
    assert decided["event"] == "approval.decided" and decided["outcome"]["status"] == "denied"

    admin = Client()
    admin.force_login(make_user(unique("admin"), groups=("admin",)))
    page = admin.get("/approvals/notifications/").content.decode()
    assert channel.name in page and "HTTP 500" in page  # the failed attempt is visible


def test_a_receiver_that_hangs_never_delays_the_agents_answer(
    live_stack: LiveStack, live_agent: AgentFixture, live_db: None
) -> None:
    import threading

    release = threading.Event()

    def respond(server: receivers.Server, received: receivers.Received) -> tuple[int, bytes]:
        server.received.append(received)
        release.wait(15)
        return 200, b"{}"

    with receivers.http_server(respond) as server:
        channel = Channel.objects.create(
            name=unique("slow-hook"), kind="webhook", config={"url": server.url, "secret": SECRET}
        )
        try:
            timings = [submit(live_stack, live_agent, f"slow{i}.txt")[1] for i in range(3)]
            server.wait_for(1, seconds=30)  # the worker is stuck on it meanwhile
            assert max(timings) < 1.0, timings
        finally:
            release.set()
            Channel.objects.filter(pk=channel.pk).update(enabled=False)
