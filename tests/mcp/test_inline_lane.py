"""The inline lane (issue 37; docs/mcp.md, "The inline lane"): an auto-allowed call of an
upstream HTTP server's tool is claimed and run by the request that admitted it, without
the queue, with the same records as the worker's run; everything else goes to the worker."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from mcp import types
from mcp.shared.exceptions import MCPError

from audit.models import AuditEvent
from dispatcher import admission, agents, batches, execution, limits, pipeline, wakeups
from dispatcher.gateways import mcp
from dispatcher.gateways.mcp_http import authenticate
from dispatcher.models import Status, ToolCall
from dispatcher.proposals import ProposedCall, canonical_json
from floor import celery_message, redis_clients
from floor.redis_clients import redis_at
from tests.dispatcher.test_running_notice import session_news
from tests.support.factories import make_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]


def open_session(agent: Any, params: dict[str, Any]) -> Any:
    """A new MCP session of `agent`, as an initialize with no run to join starts one."""
    return agents.join_run(agent=agent, client=mcp.CLIENT, title="MCP session", idle=0)[0]


def proposed(tool_use_id: str, name: str, arguments: dict[str, Any]) -> ProposedCall:
    return ProposedCall(tool_use_id, name, canonical_json(arguments), arguments)


def data_statements(queries: CaptureQueriesContext) -> list[str]:
    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK")
    return [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(control)]


def queued_messages() -> list[str]:
    """The call ids of the execution messages waiting in the broker's queue."""
    target = celery_message.raw_target(batches.EXECUTE_TASK)
    assert target is not None, "the test settings' broker is Redis"
    url, queue = target
    ids = []
    for raw in redis_at(url).lrange(queue, 0, -1):
        body = json.loads(base64.b64decode(json.loads(raw)["body"]))
        ids.extend(body[0])
    return ids


def loaded_session(token: str, external_id: str) -> Any:
    _, loaded = authenticate(token, external_id)
    assert loaded is not None
    return loaded


def test_an_allowed_upstream_http_call_runs_in_the_request_with_the_workers_records(
    trusted_upstream: str,
) -> None:
    fx = make_agent(mode="trusted")
    session = open_session(fx.agent, {})
    name = f"{trusted_upstream}__echo"
    mcp.submit(
        loaded_session(fx.token, session.external_id),
        proposed("mcp:0", name, {"text": "warm"}),
        preloaded=True,
    )
    loaded = loaded_session(fx.token, session.external_id)
    with CaptureQueriesContext(connection) as queries:
        call = mcp.submit(loaded, proposed("mcp:1", name, {"text": "inline"}), preloaded=True)
    # Answered from the request's own run: nothing left for a worker, nothing to re-read.
    assert call.status == Status.COMPLETED and call.content == "echo: inline"
    stored = ToolCall.objects.get(pk=call.pk)
    assert (stored.status, stored.content, stored.attempts) == (Status.COMPLETED, call.content, 1)
    assert str(call.pk) not in queued_messages()
    events = list(
        AuditEvent.objects.filter(subject=f"call:{call.pk}")
        .order_by("seq")
        .values_list("kind", "actor", "payload")
    )
    assert [kind for kind, _, _ in events] == [
        "call.received",
        "call.allowed",
        "call.started",
        "call.completed",
    ]
    assert events[0][2]["digest"] == stored.digest  # stored with its digest, then decided
    assert events[2][1] == "inline" and events[3][2]["content"] == "echo: inline"
    sql = data_statements(queries)
    commits = [q for q in queries.captured_queries if q["sql"] == "COMMIT"]
    if connection.vendor == "postgresql":
        # The repeat count with the generation of the upstream tools (one read for the
        # message), the call INSERT with the chain head's lock, its three events
        # (received, allowed, started: the claim) in one append; the result's UPDATE with
        # the lock, its event: two commits, the claim durable in the first, before the
        # tool runs.
        assert len(sql) == 5, sql
        assert sql[1].startswith('WITH written AS (INSERT INTO "dispatcher_toolcall"'), sql
        assert sql[3].startswith('WITH written AS (UPDATE "dispatcher_toolcall"'), sql
        assert len(commits) == 2
    else:  # (SQLite: no data-modifying WITH, so the lock, append and head are their own)
        assert len(sql) == 9, sql
        assert len(commits) == 2
    # The generation is read with the repeat count, not by the tool's lookups.
    assert '"sources_generation"' in sql[0] and "COUNT(*)" in sql[0], sql
    assert not any('"sources_generation"' in statement for statement in sql[1:]), sql


def test_only_an_upstream_http_tool_alone_in_its_message_is_kept(trusted_upstream: str) -> None:
    """A built-in tool, an upstream tool in a message of two, and an ask go to the queue
    (or the reviewer) as before: the lane is for one I/O-bound call the request waits for."""
    fx = make_agent(mode="trusted")
    session = open_session(fx.agent, {})
    echo = f"{trusted_upstream}__echo"
    for proposals in (
        [proposed("a", "list_directory", {"path": "."})],
        [proposed("b", echo, {"text": "one"}), proposed("c", echo, {"text": "two"})],
    ):
        calls, kept = admission.admit_message(
            session=session, dialect="mcp", proposed=proposals, inline=True
        )
        assert kept == [] and {c.status for c in calls} == {Status.QUEUED}
        assert str(calls[0].pk) in queued_messages()  # (the next waits for it: batch order)
    std = make_agent(mode="standard")
    asked = open_session(std.agent, {})
    calls, kept = admission.admit_message(
        session=asked,
        dialect="mcp",
        proposed=[proposed("d", f"{trusted_upstream}__write_note", {"path": "n", "text": "t"})],
        inline=True,
    )
    assert kept == [] and calls[0].status == Status.PENDING_APPROVAL


def test_a_kept_call_whose_process_died_ends_outcome_unknown_and_never_runs_twice(
    trusted_upstream: str,
) -> None:
    """The request's process dies after the admission's commit (the claim is in it): no
    worker message exists, a late delivery does nothing, and the reconciler ends the call
    as outcome_unknown once its lease has passed, as for a worker that died running it."""
    fx = make_agent(mode="trusted")
    session = open_session(fx.agent, {})
    [call], kept = admission.admit_message(
        session=session,
        dialect="mcp",
        proposed=[proposed("mcp:9", f"{trusted_upstream}__echo", {"text": "lost"})],
        inline=True,
    )
    assert kept and kept[0][0] is call  # (and the process "dies" here: it never runs it)
    stored = ToolCall.objects.get(pk=call.pk)
    assert (stored.status, stored.attempts) == (Status.RUNNING, 1)
    assert stored.lease_until is not None and str(call.pk) not in queued_messages()
    execution.execute_call(str(call.pk))  # a stray delivery: not queued, so nothing
    assert ToolCall.objects.get(pk=call.pk).status == Status.RUNNING
    ToolCall.objects.filter(pk=call.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    assert execution.reconcile()["outcome_unknown"] == 1
    ended = ToolCall.objects.get(pk=call.pk)
    assert ended.status == Status.OUTCOME_UNKNOWN and ended.attempts == 1
    kinds = list(
        AuditEvent.objects.filter(subject=f"call:{call.pk}")
        .order_by("seq")
        .values_list("kind", flat=True)
    )
    assert kinds == ["call.received", "call.allowed", "call.started", "call.outcome_unknown"]


def test_an_inline_call_wakes_its_session_with_its_result_a_slow_one_also_while_it_runs(
    trusted_upstream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a worker's claim: the admission that keeps a call wakes nobody (one Redis round
    trip less); a body still running RUNNING_NOTICE_AFTER later is announced, then its
    result; a quick one is seen once, with its result."""
    # (the quick echo under a notice delay no loaded machine can make it outlast; CI saw
    # it outlast 0.5 s at load 12)
    monkeypatch.setattr(pipeline, "RUNNING_NOTICE_AFTER", 60.0)
    monkeypatch.setattr(pipeline, "NOTICE_JOIN", 60.0)  # (the notice before the result)
    fx = make_agent(mode="trusted")
    session = open_session(fx.agent, {})
    pubsub = redis.Redis.from_url(settings.REDIS_URL).pubsub()
    pubsub.subscribe(wakeups.session_channel(str(session.pk)))
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"
    loaded = loaded_session(fx.token, session.external_id)
    quick = mcp.submit(
        loaded, proposed("mcp:q", f"{trusted_upstream}__echo", {"text": "q"}), preloaded=True
    )
    assert quick.status == Status.COMPLETED
    assert session_news(pubsub) == [f"{quick.pk} completed"]

    # (the slow one's body sleeps twenty times the notice delay)
    monkeypatch.setattr(pipeline, "RUNNING_NOTICE_AFTER", 0.05)
    loaded = loaded_session(fx.token, session.external_id)
    slow = mcp.submit(
        loaded, proposed("mcp:s", f"{trusted_upstream}__slow", {"seconds": 1.0}), preloaded=True
    )
    assert slow.status == Status.COMPLETED and slow.content == "slept 1.0"
    assert session_news(pubsub) == [f"{slow.pk} running", f"{slow.pk} completed"]
    pubsub.close()
    events = AuditEvent.objects.filter(subject=f"call:{slow.pk}").order_by("seq")
    assert [e.actor for e in events if e.kind == "call.started"] == ["inline"]


def test_a_request_that_ended_before_its_admission_began_admits_nothing(
    trusted_upstream: str,
) -> None:
    """Its ORM trip starts only after the request ended (daphne cancelled it while every
    thread was busy): the slot it takes is given back at once and nothing is admitted or
    run, rather than run inline without a slot (past the agent's limit)."""
    fx = make_agent(mode="trusted")
    session = open_session(fx.agent, {})
    slot = mcp.WaitSlot(fx.agent, 30)
    slot.request_ended()
    with pytest.raises(MCPError) as refused:
        mcp.submit(
            loaded_session(fx.token, session.external_id),
            proposed("mcp:late", f"{trusted_upstream}__echo", {"text": "late"}),
            preloaded=True,
            slot=slot,
        )
    assert refused.value.error.code == types.INVALID_REQUEST
    assert not ToolCall.objects.filter(session=session).exists()
    assert limits.waits_held(fx.agent) == 0


# --- The body on the request's loop (pipeline.runs_on_loop) ----------------------------------

WRAPPED: list[str] = []


def recording_wrapper(tool: Any, ctx: Any, arguments: dict[str, Any]) -> Any:
    """A deployment's execute wrapper (HARNESS_EXECUTE_WRAPPER): it sees every call."""
    WRAPPED.append(ctx.call_id)
    return pipeline.default_execute_wrapper(tool, ctx, arguments)


def test_a_call_run_on_the_loop_has_the_threads_records_and_statements(
    trusted_upstream: str,
) -> None:
    """The gateway's lane: admitted and claimed on one trip (`mcp.admit`, on_loop), its
    body awaited on the request's loop (execution.run_body_async, no thread held), its
    result written on a second trip (`mcp.finish`): the same events, the same statements
    and commits as the run on the admission's thread, and no message for a worker."""
    fx = make_agent(mode="trusted")
    session = open_session(fx.agent, {})
    name = f"{trusted_upstream}__echo"
    mcp.submit(
        loaded_session(fx.token, session.external_id),
        proposed("mcp:0", name, {"text": "warm"}),
        preloaded=True,
    )
    loaded = loaded_session(fx.token, session.external_id)
    with CaptureQueriesContext(connection) as queries:
        call, pending = mcp.admit(
            loaded, proposed("mcp:1", name, {"text": "loop"}), preloaded=True, on_loop=True
        )
        assert pending is not None and call.status == Status.RUNNING
        assert ToolCall.objects.get(pk=call.pk).status == Status.RUNNING  # claimed, durable
        admission_statements = len(queries.captured_queries)
        outcome, seconds = asyncio.run(execution.run_body_async(*pending))
        assert len(queries.captured_queries) == admission_statements  # (no database on the loop)
        call = mcp.finish(call, pending, outcome, seconds, None)
    assert call.status == Status.COMPLETED and call.content == "echo: loop"
    stored = ToolCall.objects.get(pk=call.pk)
    assert (stored.status, stored.content, stored.attempts) == (Status.COMPLETED, call.content, 1)
    assert str(call.pk) not in queued_messages()
    events = list(
        AuditEvent.objects.filter(subject=f"call:{call.pk}")
        .order_by("seq")
        .values_list("kind", "actor", "payload")
    )
    assert [kind for kind, _, _ in events] == [
        "call.received",
        "call.allowed",
        "call.started",
        "call.completed",
    ]
    assert events[2][1] == "inline" and events[3][2]["content"] == "echo: loop"
    sql = data_statements(queries)
    commits = [q for q in queries.captured_queries if q["sql"] == "COMMIT"]
    # (the ToolCall read above the count's check is the test's own)
    assert len(sql) == (6 if connection.vendor == "postgresql" else 10), sql
    assert len(commits) == 2


def test_a_call_run_on_the_loop_wakes_its_session_and_frees_its_slot_in_one_round_trip(
    trusted_upstream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The result's trip (`mcp.finish`): its wake-up reaches the session's listeners and the
    request's wait slot is given back before it returns, both sent to Redis in one round
    trip (two before: a PUBLISH after the commit, then the slot's ZREM)."""
    fx = make_agent(mode="trusted")
    session = open_session(fx.agent, {})
    name = f"{trusted_upstream}__echo"
    mcp.submit(
        loaded_session(fx.token, session.external_id),
        proposed("mcp:0", name, {"text": "warm"}),
        preloaded=True,
    )
    pubsub = redis.Redis.from_url(settings.REDIS_URL).pubsub()
    pubsub.subscribe(wakeups.session_channel(str(session.pk)))
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"
    slot = mcp.WaitSlot(fx.agent, 30)
    call, pending = mcp.admit(
        loaded_session(fx.token, session.external_id),
        proposed("mcp:1", name, {"text": "trip"}),
        preloaded=True,
        slot=slot,
        on_loop=True,
    )
    assert pending is not None and limits.waits_held(fx.agent) == 1  # held while it runs
    outcome, seconds = asyncio.run(execution.run_body_async(*pending))
    sent: list[int] = []
    send: Any = redis.connection.AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        sent.append(1)
        send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    call = mcp.finish(call, pending, outcome, seconds, slot)
    monkeypatch.undo()
    assert call.status == Status.COMPLETED and call.content == "echo: trip"
    assert len(sent) == 1, sent
    assert limits.waits_held(fx.agent) == 0
    # (a "running" notice first when the body took longer than pipeline.RUNNING_NOTICE_AFTER)
    assert session_news(pubsub)[-1:] == [f"{call.pk} completed"]
    pubsub.close()


def test_a_round_trip_that_fails_loses_only_what_a_failed_send_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis gone when the round trip is sent: each command kept is logged as lost, as its
    sender would have logged it, and nothing raises (the call's answer does not depend on
    a wake-up or a slot's release: an unreleased slot lapses)."""
    with redis_clients.one_round_trip("redis://127.0.0.1:1/0"):
        assert redis_clients.held(settings.REDIS_URL) is None  # (another server's trip)
        trip = redis_clients.held("redis://127.0.0.1:1/0")
        assert trip is not None
        trip.add(("PUBLISH", "nowhere", "x"), "the wake-up for call c1")
        trip.add(("ZREM", "nowhere", "m"), "the wait slot s1")
    assert "the wake-up for call c1, the wait slot s1" in caplog.text
    assert redis_clients.held("redis://127.0.0.1:1/0") is None


def test_a_deployments_execute_wrapper_sees_every_inline_call(
    trusted_upstream: str, settings: Any
) -> None:
    """HARNESS_EXECUTE_WRAPPER wraps `execute`, not an async body: with one set, the
    gateway runs an inline call on its admission's thread through it (nothing is kept
    for the loop), so budgets and metrics a deployment adds there miss no call."""
    settings.HARNESS_EXECUTE_WRAPPER = f"{__name__}.recording_wrapper"
    WRAPPED.clear()
    fx = make_agent(mode="trusted")
    session = open_session(fx.agent, {})
    call, pending = mcp.admit(
        loaded_session(fx.token, session.external_id),
        proposed("mcp:w", f"{trusted_upstream}__echo", {"text": "wrapped"}),
        preloaded=True,
        on_loop=True,
    )
    assert pending is None
    assert (call.status, call.content) == (Status.COMPLETED, "echo: wrapped")
    assert WRAPPED == [str(call.pk)]  # noqa: SIM300 - (what the wrapper saw)


def test_a_slow_call_run_on_the_loop_is_announced_running_then_completed(
    trusted_upstream: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The running notice of a body awaited on the loop: on a thread of its own, before
    the result's wake-up; none for a quick one."""
    # (the quick echo under a notice delay no loaded machine can make it outlast, and the
    # notice's thread waited for as long as a loaded machine needs: at load 11 it published
    # after NOTICE_JOIN's second, behind the result's wake-up)
    monkeypatch.setattr(pipeline, "RUNNING_NOTICE_AFTER", 60.0)
    monkeypatch.setattr(pipeline, "NOTICE_JOIN", 60.0)
    fx = make_agent(mode="trusted")
    session = open_session(fx.agent, {})
    pubsub = redis.Redis.from_url(settings.REDIS_URL).pubsub()
    pubsub.subscribe(wakeups.session_channel(str(session.pk)))
    assert pubsub.get_message(timeout=2)["type"] == "subscribe"

    async def run(tool_use_id: str, tool: str, arguments: dict[str, Any]) -> Any:
        loaded = await mcp.db(loaded_session)(fx.token, session.external_id)
        call, pending = await mcp.db(mcp.admit)(
            loaded, proposed(tool_use_id, tool, arguments), preloaded=True, on_loop=True
        )
        assert pending is not None
        return await mcp.run_pending(call, pending, None)

    quick = asyncio.run(run("mcp:q", f"{trusted_upstream}__echo", {"text": "q"}))
    assert quick.status == Status.COMPLETED
    assert session_news(pubsub) == [f"{quick.pk} completed"]
    monkeypatch.setattr(pipeline, "RUNNING_NOTICE_AFTER", 0.05)
    slow = asyncio.run(run("mcp:s", f"{trusted_upstream}__slow", {"seconds": 1.0}))
    assert slow.status == Status.COMPLETED and slow.content == "slept 1.0"
    assert session_news(pubsub) == [f"{slow.pk} running", f"{slow.pk} completed"]
    pubsub.close()
