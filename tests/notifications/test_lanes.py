"""Separate lanes (issue 31): tool execution has a Celery queue of its own, so a flood of
asks whose notifications are stuck in a slow receiver never holds another agent's
auto-allowed call. Real daphne, one worker per lane (as docs/operations.md runs them), a
private Redis, and a receiver that holds every request until the test lets it go."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from approvals.models import Channel, Delivery
from tests.battery.conftest import battery_db, procs, redis_server  # noqa: F401  (fixtures)
from tests.battery.procs import ProcessGroup, RedisServer, Stack, wait_until
from tests.notifications import receivers
from tests.support.factories import make_agent, unique

pytestmark = pytest.mark.live

SECRET = "lanes-webhook-secret-0123456789"
FLOOD = 12


@pytest.mark.timeout(300)
def test_a_flood_of_asks_stuck_in_a_slow_receiver_never_delays_another_agents_call(
    procs: ProcessGroup,  # noqa: F811
    redis_server: RedisServer,  # noqa: F811
    battery_db: None,  # noqa: F811
) -> None:
    release = threading.Event()

    def hold(server: receivers.Server, received: receivers.Received) -> tuple[int, bytes]:
        server.received.append(received)
        release.wait(120)  # the slow relay: holds the delivery's worker until released
        return 200, b"{}"

    with receivers.http_server(hold) as receiver:
        channel = Channel.objects.create(
            name=unique("stuck"), kind="webhook", config={"url": receiver.url, "secret": SECRET}
        )
        try:
            stack = Stack(
                procs,
                redis_server,
                HARNESS_OUTBOUND_ALLOW="127.0.0.1",
                HARNESS_OUTBOUND_TIMEOUT="120",
            )
            url = stack.daphne()
            stack.worker(concurrency=2, queues=stack.env["HARNESS_CELERY_BACKGROUND_QUEUE"])
            stack.worker(concurrency=1, queues=stack.env["HARNESS_CELERY_QUEUE"])
            flood(stack, url)
            # Both of the background lane's processes are now inside the receiver.
            wait_until(lambda: len(receiver.received) >= 2, 60, "two deliveries held")

            answer = list_directory(stack, url)
            assert answer["status"] == "completed" and answer["is_error"] is False
            # ... while every notification is still stuck: none sent, no third one started.
            assert not release.is_set() and len(receiver.received) == 2
            assert not Delivery.objects.filter(channel=channel, state=Delivery.State.SENT).exists()
        finally:
            release.set()
            Channel.objects.filter(pk=channel.pk).update(enabled=False)


def flood(stack: Stack, url: str) -> None:
    """One agent's message of FLOOD writes: FLOOD asks, each a delivery to the receiver."""
    fx = make_agent(mode="standard")
    with stack.agent_client(url, fx.headers) as client:
        session = client.post("/api/v1/sessions", json={}).json()["id"]
        calls = [
            {
                "id": f"w{i}",
                "name": "write_file",
                "arguments": {"path": f"f{i}.txt", "content": "x"},
            }
            for i in range(FLOOD)
        ]
        response = client.post(f"/api/v1/sessions/{session}/calls", json={"calls": calls})
    assert response.status_code == 202
    assert {c["status"] for c in response.json()["calls"]} == {"pending_approval"}


def list_directory(stack: Stack, url: str) -> Any:
    """Another agent's auto-allowed read, waiting for its result."""
    fx = make_agent(mode="standard")
    with stack.agent_client(url, fx.headers, timeout=60) as client:
        session = client.post("/api/v1/sessions", json={}).json()["id"]
        body = {"calls": [{"id": "l1", "name": "list_directory", "arguments": {"path": "."}}]}
        response = client.post(f"/api/v1/sessions/{session}/calls?wait=30", json=body)
    assert response.status_code == 200, response.text[:500]
    return response.json()["calls"][0]
