"""What a decision sends after its commit, on the real Redis channel layer and pub/sub: the
worker's message, then the waiting agent's wake-up and the reviewer queues' removal, kept
and sent together in one round trip (docs/benchmarks.md, "decide()'s pushes in one round
trip")."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import redis
from channels.layers import get_channel_layer
from django.conf import settings

from approvals import live
from approvals import services as approvals
from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from dispatcher import agents
from dispatcher.models import Status, ToolCall
from dispatcher.wakeups import session_channel
from floor import redis_clients
from tests.approvals.conftest import closing_connections, run_async
from tests.support.factories import make_agent, make_user, submit_one

pytestmark = pytest.mark.django_db(transaction=True)


def pending(tool_use_id: str = "w1") -> tuple[ToolCall, ApprovalRequest]:
    fx = make_agent(mode="standard")
    session = agents.start_session(agent=fx.agent)
    call = submit_one(session, "write_file", {"path": "pushed.txt", "content": "x"}, tool_use_id)
    assert call.status == Status.PENDING_APPROVAL
    return call, ApprovalRequest.objects.get(call=call)


def test_a_decision_reaches_its_teams_queues_and_the_waiting_agent_and_no_other_team() -> None:
    call, approval = pending()
    team = call.session.team_id
    reviewer = make_user("pushes-reviewer", groups=("reviewer",))
    wake = redis.Redis.from_url(settings.REDIS_URL).pubsub()
    wake.subscribe(session_channel(str(call.session_id)))
    assert wake.get_message(timeout=5) is not None  # (the subscription, confirmed)

    async def scenario() -> dict[str, Any]:
        layer = get_channel_layer()
        assert layer is not None
        groups = [live.GROUP, live.team_group(team or 0), live.team_group((team or 0) + 1000)]
        sockets = {}
        for group in groups:
            sockets[group] = await layer.new_channel()
            await layer.group_add(group, sockets[group])
        await asyncio.to_thread(
            closing_connections(
                lambda: approvals.decide(
                    approval_id=approval.pk, user=reviewer, approve=False, digest=call.digest
                )
            )
        )
        got: dict[str, Any] = {}
        for group in groups[:2] if team is not None else groups[:1]:
            got[group] = await asyncio.wait_for(layer.receive(sockets[group]), 10)
        # Another team's queue: nothing of this call, not even its removal.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(layer.receive(sockets[groups[2]]), 0.5)
        return got

    got = run_async(scenario)
    removal = f'<div id="call-{call.pk}" hx-swap-oob="delete"></div>'
    assert all(removal in message["html"] for message in got.values()), got
    assert len(got) == (2 if team is not None else 1)
    message = wake.get_message(ignore_subscribe_messages=True, timeout=5)
    assert message is not None and message["data"] == f"{call.pk} denied".encode()
    wake.close()


def test_with_redis_unreachable_after_the_commit_the_decision_is_kept_and_the_loss_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The pushes leave after the commit: a Redis that refuses them loses a wake-up and a
    queue's removal (repaired by the agent's last read and the socket's reconnect), never
    the decision, and the reviewer's request is answered."""
    call, approval = pending("w2")
    reviewer = make_user("pushes-reviewer-2", groups=("reviewer",))
    dead = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=1)
    monkeypatch.setattr(redis_clients, "redis_at", lambda url: dead)
    with caplog.at_level(logging.WARNING, logger="floor.redis_clients"):
        decided = approvals.decide(
            approval_id=approval.pk, user=reviewer, approve=False, digest=call.digest
        )
    assert decided.decision == "denied"
    assert ToolCall.objects.get(pk=call.pk).status == Status.DENIED
    assert AuditEvent.objects.filter(kind="call.denied", subject=f"call:{call.pk}").exists()
    lost = [r.getMessage() for r in caplog.records if "could not send to Redis" in r.getMessage()]
    assert lost and f"the wake-up for call {call.pk}" in lost[0], lost
    assert f"the queue push to {live.GROUP}" in lost[0], lost
