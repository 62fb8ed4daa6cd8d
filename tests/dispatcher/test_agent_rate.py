"""A per-agent request rate on every gateway (dispatcher.limits.take_request): a token
bucket in Redis, taken once the token is verified and before anything of the request is
admitted. Past it the agent gets 429 with Retry-After and nothing is recorded; another
agent keeps its own share; a rate of 0 turns it off. And the red-team of the caps: a
session header, many sessions or the hooks do not give an agent a second share."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest
import redis
from django.conf import settings as django_settings
from django.test import Client

from audit.models import AuditEvent
from dispatcher import limits
from dispatcher.models import AgentSession, Status, ToolCall
from tests.approvals.conftest import closing_connections, start_session
from tests.coding_agents.test_claude_code_hook_command import run_hook
from tests.mcp.conftest import mcp_session, run, wait_for_pending
from tests.support.claude_code_hooks import decision, pre_tool_use, send
from tests.support.factories import AgentFixture, make_agent
from tests.support.live import LiveStack

from .test_agent_caps import MCP_HEADERS, mcp_initialize, submit, write

BURST = 3


@pytest.fixture
def slow_rate(settings: Any) -> None:
    """Three requests at once, then one every 10 s: the fourth request in a row is refused
    (and counted: it says to come back in 20 s)."""
    settings.HARNESS_AGENT_REQUESTS_PER_SECOND = 0.1
    settings.HARNESS_AGENT_REQUEST_BURST = BURST
    settings.HARNESS_MAX_SESSIONS_PER_MINUTE = 0


def tools(fx: AgentFixture) -> Any:
    return Client().get("/api/v1/tools", headers=fx.headers)


def assert_refused(response: Any) -> None:
    assert response.status_code == 429, response.content
    error = response.json()["error"]
    assert error["code"] == "too_many_requests"
    assert "HARNESS_AGENT_REQUESTS_PER_SECOND" in error["message"]
    assert "nothing was recorded" in error["message"]
    assert 1 <= int(response["Retry-After"]) <= 20  # a refusal counts: one more token


@pytest.mark.django_db
def test_past_its_rate_an_agent_gets_429_and_another_agent_keeps_its_share(
    agent: AgentFixture, slow_rate: None
) -> None:
    assert [tools(agent).status_code for _ in range(BURST)] == [200] * BURST
    assert_refused(tools(agent))
    other = make_agent()
    assert [tools(other).status_code for _ in range(BURST)] == [200] * BURST


@pytest.mark.django_db
def test_a_refused_submission_records_nothing_and_the_same_one_later_records_once(
    agent: AgentFixture, slow_rate: None, settings: Any
) -> None:
    session_id = start_session(agent)  # one request of the bucket
    assert submit(agent, session_id, [write("a1")]).status_code == 202
    assert tools(agent).status_code == 200
    refused = submit(agent, session_id, [write("a2")])
    assert_refused(refused)
    assert list(
        ToolCall.objects.filter(session_id=session_id).values_list("tool_use_id", flat=True)
    ) == ["a1"]
    assert AuditEvent.objects.filter(kind="call.received").count() == 1
    # Time passes (the rate is raised, so the bucket refills at once), and the request
    # reaches a web process that has not refused this token (this one remembers it).
    settings.HARNESS_AGENT_REQUESTS_PER_SECOND = 1000
    limits._refused_until.clear()
    assert submit(agent, session_id, [write("a2")]).status_code == 202
    assert ToolCall.objects.filter(session_id=session_id).count() == 2


@pytest.mark.django_db
def test_hooks_take_from_the_same_bucket_and_a_refused_hook_starts_no_session(
    agent: AgentFixture, slow_rate: None
) -> None:
    start_session(agent)
    read = pre_tool_use(str(uuid.uuid4()), "Read", {"file_path": "/home/dev/project/a.py"})
    assert decision(send(agent, read))[0] == "allow"
    assert tools(agent).status_code == 200
    fresh = pre_tool_use(str(uuid.uuid4()), "Read", {"file_path": "/home/dev/project/b.py"})
    assert_refused(send(agent, fresh))
    assert AgentSession.objects.filter(agent=agent.agent).count() == 2  # nothing started
    report = {**read, "hook_event_name": "PostToolUse", "tool_response": {"ok": True}}
    assert_refused(send(agent, report))


@pytest.mark.django_db
def test_many_sessions_share_one_bucket(agent: AgentFixture, slow_rate: None) -> None:
    """A session (an API session id, a client's session id) is not a second share."""
    hooks = [
        pre_tool_use(str(uuid.uuid4()), "Read", {"file_path": "/home/dev/project/a.py"})
        for _ in range(BURST)
    ]
    assert [decision(send(agent, hook))[0] for hook in hooks] == ["allow"] * BURST
    assert_refused(send(agent, hooks[0]))
    assert_refused(
        Client().post(
            "/api/v1/sessions", data="{}", content_type="application/json", headers=agent.headers
        )
    )


@pytest.mark.django_db
def test_a_bad_token_takes_nothing_from_the_agent_it_imitates(
    agent: AgentFixture, slow_rate: None
) -> None:
    """The bucket is keyed by the verified agent: a forged token carrying the agent's prefix
    is refused 401 and does not drain its share."""
    forged = {"Authorization": f"Bearer hrn_{agent.agent.token_prefix}_{'x' * 40}"}
    for _ in range(BURST * 3):
        assert Client().get("/api/v1/tools", headers=forged).status_code == 401
    assert [tools(agent).status_code for _ in range(BURST)] == [200] * BURST


@pytest.mark.django_db
def test_a_rate_of_zero_is_off(agent: AgentFixture, settings: Any) -> None:
    settings.HARNESS_AGENT_REQUESTS_PER_SECOND = 0
    settings.HARNESS_AGENT_REQUEST_BURST = 1
    assert [tools(agent).status_code for _ in range(10)] == [200] * 10


@pytest.mark.live
def test_the_bucket_refills_at_its_rate_with_redis_clock(live_db: None, settings: Any) -> None:
    """The script's own arithmetic: a burst, then one request per 1/rate seconds; a refused
    request counts, so the refusal says to wait for two."""
    settings.HARNESS_AGENT_REQUESTS_PER_SECOND = 20
    settings.HARNESS_AGENT_REQUEST_BURST = 5
    fx = make_agent()
    for _ in range(5):
        limits.take_request(fx.agent, fx.token)
    with pytest.raises(limits.TooManyRequests) as refused:
        limits.take_request(fx.agent, fx.token)
    assert 50 < refused.value.retry_after_ms <= 100  # the refused request counted too
    assert refused.value.retry_after == 1
    early = limits.refused_early(fx.token)  # this process answers again without Redis
    assert early is not None and early.retry_after_ms <= refused.value.retry_after_ms
    assert limits.refused_early(make_agent().token) is None  # another token: never
    time.sleep(refused.value.retry_after_ms / 1000 + 0.01)
    assert limits.refused_early(fx.token) is None
    limits.take_request(fx.agent, fx.token)  # one token back, as the refusal said


# --- through the live daphne: MCP and harness-hook ------------------------------------------


def drain(fx: AgentFixture, seconds: float) -> None:
    """Leave the agent's bucket `seconds` of requests in debt, as a flood just before would
    (refused requests take nothing, so a flood alone leaves it near zero, and the live
    daphne's rate is the default 20/s: this makes the refusal certain whatever the load)."""
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    key = ":".join([django_settings.HARNESS_LIMITS_PREFIX, "rate", limits.agent_key(fx.agent)])
    now = client.time()
    deficit = -seconds * float(django_settings.HARNESS_AGENT_REQUESTS_PER_SECOND)
    client.hset(key, mapping={"tokens": deficit, "at": now[0] + now[1] / 1e6})
    client.expire(key, 120)


@pytest.mark.live
def test_the_mcp_gateway_refuses_past_the_rate_before_reading_the_request(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    with live_stack.client(live_agent) as client:
        init = mcp_initialize(client, live_agent)
        mcp = {
            **live_agent.headers,
            **MCP_HEADERS,
            "Mcp-Session-Id": init.headers["mcp-session-id"],
        }
        call = {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "list_directory", "arguments": {"path": "."}},
        }
        drain(live_agent, 30)
        refused = client.post("/mcp/", json=call, headers=mcp)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "too_many_requests"
        assert 25 <= int(refused.headers["retry-after"]) <= 31
        # Another session header, a made-up one, or a new initialize: the same bucket.
        for header in (init.headers["mcp-session-id"], "0" * 32, ""):
            again = client.post("/mcp/", json=call, headers={**mcp, "Mcp-Session-Id": header})
            assert again.status_code == 429, again.text
        assert mcp_initialize(client, live_agent).status_code == 429
        assert not ToolCall.objects.filter(session__agent=live_agent.agent).exists()
        assert AgentSession.objects.filter(agent=live_agent.agent).count() == 1
        other = make_agent(mode="standard")
        with live_stack.client(other) as other_client:
            assert mcp_initialize(other_client, other).status_code == 200


@pytest.mark.live
def test_harness_hook_waits_out_a_short_retry_after_once(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    body = json.dumps(
        pre_tool_use(str(uuid.uuid4()), "Read", {"file_path": "/home/dev/project/a.py"})
    ).encode()
    drain(live_agent, 1.5)
    started = time.monotonic()
    ran = run_hook(body, live_stack.url, token=live_agent.token)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["hookSpecificOutput"]["permissionDecision"] == "allow"
    assert time.monotonic() - started >= 1  # it paused as told, then was answered
    drain(live_agent, 30)  # past what the hook waits out: it blocks the tool, saying why
    ran = run_hook(body, live_stack.url, token=live_agent.token)
    assert ran.returncode == 2
    assert "429 too_many_requests" in ran.stderr and "the tool was not run" in ran.stderr


@pytest.mark.live
def test_an_mcp_body_of_many_messages_does_no_work_per_message(
    live_stack: LiveStack, live_agent: AgentFixture
) -> None:
    """One HTTP request takes one request from the rate: a JSON array of thousands of
    `notifications/cancelled` (a read each) must not be read message by message. The SDK
    refuses arrays (the protocol has no batches since 2025-06-18), so Harness reads none:
    a cancellation inside one cancels nothing, and a lone one still cancels."""

    def cancelled(call: ToolCall) -> bool:
        return AuditEvent.objects.filter(subject=f"call:{call.pk}", kind="call.cancelled").exists()

    async def scenario() -> tuple[int, bool]:
        import anyio

        async with mcp_session(live_stack, live_agent) as (session, session_id):
            async with anyio.create_task_group() as group:
                group.start_soon(session.call_tool, "write_file", {"path": "n.txt", "content": "x"})
                call = await anyio.to_thread.run_sync(
                    closing_connections(
                        lambda: wait_for_pending(session_id() or "", tool="write_file")
                    )
                )
                cancel = {
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    # (the call's JSON-RPC id: its tool_use_id is "mcp:<id>")
                    "params": {
                        "requestId": int(call.tool_use_id.removeprefix("mcp:")),
                        "reason": "in an array",
                    },
                }
                headers = {
                    **live_agent.headers,
                    **MCP_HEADERS,
                    "Mcp-Session-Id": session_id() or "",
                }
                async with httpx.AsyncClient(base_url=live_stack.url, timeout=30) as http:
                    batch = await http.post("/mcp/", json=[cancel] * 5000, headers=headers)
                await anyio.sleep(0.5)
                await anyio.to_thread.run_sync(closing_connections(call.refresh_from_db))
                still = call.status
                # Read before the task is cancelled: the SDK's v2 client may then send a
                # cancellation of its own for the abandoned request, which does cancel.
                audited = await anyio.to_thread.run_sync(
                    closing_connections(lambda: cancelled(call))
                )
                group.cancel_scope.cancel()
            assert still == Status.PENDING_APPROVAL, still
            return batch.status_code, audited

    status, audited = run(scenario)
    assert status == 400  # the SDK's answer to an array
    assert not audited
