"""The hot paths' SQL budgets (bench S1, S5, S6): a regression that adds round trips to
admission, a decision or an execution fails here, not only in the benchmark."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from approvals import services as approvals
from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from dispatcher import admission, agents, execution
from dispatcher.gateways.dialects import ProposedCall, canonical_json
from dispatcher.models import Status, ToolCall
from tests.support.factories import make_agent, make_user, submit_one


def statements(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries]


def hook_body(session_id: str, event: str, tool_use_id: str, **extra: object) -> dict[str, object]:
    """Claude Code's hook input for a Read of one project file."""
    return {
        "session_id": session_id,
        "cwd": "/home/dev/project",
        "hook_event_name": event,
        "tool_name": "Read",
        "tool_input": {"file_path": "/home/dev/project/src/app.py"},
        "tool_use_id": tool_use_id,
        **extra,
    }


@pytest.mark.django_db(transaction=True)
def test_an_auto_allowed_call_is_admitted_in_four_statements_and_one_commit() -> None:
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    client = Client(headers=fx.headers)
    body = {"calls": [{"id": "a1", "name": "list_directory", "arguments": {"path": "."}}]}
    url = f"/api/v1/sessions/{session.pk}/calls"
    with CaptureQueriesContext(connection) as queries:
        response = client.post(url, json.dumps(body), content_type="application/json")
    assert response.status_code == 202, response.content
    assert response.json()["calls"][0]["status"] == "queued"
    sql = statements(queries)
    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK")
    data = [s for s in sql if not s.startswith(control)]
    # token + session + owner + profile + grants in one read, the repeat count, the call
    # (no idempotency read: a known tool_use_id fails the INSERT and is read then) with
    # the chain head's lock in one statement, then both events and the head update in one
    # statement (on SQLite, which has no data-modifying WITH, four statements for those).
    assert len(data) == (4 if connection.vendor == "postgresql" else 6), data
    if connection.vendor == "postgresql":
        assert data[2].startswith('WITH written AS (INSERT INTO "dispatcher_toolcall"'), data
    if connection.vendor == "postgresql":  # SQLite's BEGIN is not a captured query
        assert [s for s in sql if s.startswith(control)] == ["BEGIN", "COMMIT"], sql
    kinds = AuditEvent.objects.filter(chain=str(session.pk)).order_by("seq")
    assert [e.kind for e in kinds] == ["session.started", "call.received", "call.allowed"]
    call = ToolCall.objects.get(session=session)
    assert call.enqueued_at is not None and call.status == Status.QUEUED


def test_a_finished_call_does_not_touch_the_rest_of_its_batch(db: None) -> None:
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    proposed = [
        ProposedCall(f"r{i}", "list_directory", canonical_json({"path": "."}), {"path": "."})
        for i in range(20)
    ]
    calls = admission.submit_calls(session=session, dialect="native", proposed=proposed)
    assert all(c.enqueued_at is not None for c in calls)  # one concurrency-safe run
    with CaptureQueriesContext(connection) as queries:
        execution.execute_call(str(calls[0].pk))
    assert ToolCall.objects.get(pk=calls[0].pk).status == Status.COMPLETED
    updates = [s for s in statements(queries) if 'UPDATE "dispatcher_toolcall"' in s]
    assert len(updates) == 2, updates  # the claim and the result, nothing for the other 19
    # The read; the claim and the result, each in a savepoint (the test's transaction; a
    # real worker commits): on PostgreSQL the conditional UPDATE with the chain head's lock
    # in one statement, then the audit append in one; on SQLite the UPDATE, the head read,
    # the events' INSERT and the head's UPDATE. No batch read for what is next: every call
    # of the batch was sent at admission, so nothing can be.
    assert all(c.batch_all_sent for c in ToolCall.objects.filter(batch_id=calls[0].batch_id))
    assert len(queries) == (9 if connection.vendor == "postgresql" else 13), statements(queries)
    assert not [s for s in statements(queries) if "batch_id" in s.split("WHERE")[-1]]
    if connection.vendor == "postgresql":
        assert all(s.startswith("WITH written AS (UPDATE") for s in updates), updates


def test_a_call_that_waits_in_its_batch_is_sent_when_the_run_before_it_finishes(
    db: None,
) -> None:
    """Two reads, then a write: the write waits for both reads (it is not concurrency-safe),
    so the batch is not all sent at admission, and the finish of the last read reads the
    batch and sends it."""
    session = agents.start_session(agent=make_agent(mode="trusted").agent)
    listing = canonical_json({"path": "."})
    writing = {"path": "out.txt", "content": "x"}
    proposed = [
        ProposedCall("r1", "list_directory", listing, {"path": "."}),
        ProposedCall("r2", "list_directory", listing, {"path": "."}),
        ProposedCall("w", "write_file", canonical_json(writing), writing),
    ]
    first, second, write = admission.submit_calls(
        session=session, dialect="native", proposed=proposed
    )
    assert [c.status for c in (first, second, write)] == [Status.QUEUED] * 3
    assert first.enqueued_at and second.enqueued_at and write.enqueued_at is None
    assert not any(c.batch_all_sent for c in (first, second, write))
    execution.execute_call(str(first.pk))
    assert ToolCall.objects.get(pk=write.pk).enqueued_at is None  # the second still runs
    with CaptureQueriesContext(connection) as queries:
        execution.execute_call(str(second.pk))
    assert ToolCall.objects.get(pk=write.pk).enqueued_at is not None
    assert [s for s in statements(queries) if "batch_id" in s.split("WHERE")[-1]]


def test_a_finished_call_alone_in_its_batch_reads_nothing_after_its_result(db: None) -> None:
    """The usual call (one per message): the worker's read, the claim and the result; no
    read of the batch for what is next, since nothing is."""
    session = agents.start_session(agent=make_agent(mode="trusted").agent)
    proposed = [ProposedCall("one", "list_directory", canonical_json({"path": "."}), {"path": "."})]
    [call] = admission.submit_calls(session=session, dialect="native", proposed=proposed)
    assert call.batch_size == 1
    with CaptureQueriesContext(connection) as queries:
        execution.execute_call(str(call.pk))
    assert ToolCall.objects.get(pk=call.pk).status == Status.COMPLETED
    # As above, less the batch read: 9 on PostgreSQL, 13 on SQLite.
    assert len(queries) == (9 if connection.vendor == "postgresql" else 13), statements(queries)
    assert not [s for s in statements(queries) if "batch_id" in s.split("WHERE")[-1]]


@pytest.mark.django_db(transaction=True)
def test_an_approval_reuses_the_call_read_under_the_approvals_lock() -> None:
    fx = make_agent(mode="standard")
    session = agents.start_session(agent=fx.agent)
    call = submit_one(session, "write_file", {"path": "f.txt", "content": "x"})
    approval = ApprovalRequest.objects.get(call=call)
    reviewer = make_user("budget-reviewer", groups=("reviewer",))
    with CaptureQueriesContext(connection) as queries:
        approvals.decide(approval_id=approval.pk, user=reviewer, approve=True, digest=call.digest)
    stored = ToolCall.objects.get(pk=call.pk)
    assert stored.status == Status.QUEUED and stored.enqueued_at is not None
    call_reads = [s for s in statements(queries) if s.startswith('SELECT "dispatcher_toolcall"')]
    # No read of the call: it was read (and is held) under the approval's lock, and moves
    # by a conditional update; alone in its batch, its message is marked sent in that same
    # update, so the batch is not read either. No savepoints: one transaction.
    assert call_reads == []
    assert not [s for s in statements(queries) if "SAVEPOINT" in s]
    if connection.vendor == "postgresql":
        # The reviewer's role, BEGIN, the approval's lock (with its call), the call's
        # update with the head's lock, the audit append, the approval's row, COMMIT, and
        # after it the notifications' read for the outcome event.
        assert len(queries) == 8, statements(queries)


@pytest.mark.django_db(transaction=True)
def test_an_auto_allowed_pre_tool_use_is_answered_in_four_statements_and_one_commit() -> None:
    fx = make_agent(mode="standard")
    client = Client(headers=fx.headers)

    def pre_tool_use(tool_use_id: str) -> dict[str, object]:
        return hook_body("cc-budget", "PreToolUse", tool_use_id)

    url = "/api/v1/hooks/claude-code?wait=0"
    first = client.post(url, json.dumps(pre_tool_use("t1")), content_type="application/json")
    assert first.json()["hookSpecificOutput"]["permissionDecision"] == "allow"
    with CaptureQueriesContext(connection) as queries:
        response = client.post(url, json.dumps(pre_tool_use("t2")), content_type="application/json")
    assert response.json()["hookSpecificOutput"]["permissionDecision"] == "allow"
    sql = statements(queries)
    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK")
    data = [s for s in sql if not s.startswith(control)]
    # The session with its agent (the token checked), owner, profile and grants in one
    # read; the repeat count; the call with the chain head's lock (two statements on
    # SQLite); the events and head update in one statement (two on SQLite).
    assert len(data) == (4 if connection.vendor == "postgresql" else 6), data
    if connection.vendor == "postgresql":
        assert [s for s in sql if s.startswith(control)] == ["BEGIN", "COMMIT"], sql


@pytest.mark.django_db(transaction=True)
def test_a_post_tool_use_report_is_recorded_in_five_statements_and_one_commit() -> None:
    fx = make_agent(mode="standard")
    client = Client(headers=fx.headers)
    url = "/api/v1/hooks/claude-code?wait=0"

    def hook(event: str, tool_use_id: str, **extra: object) -> dict[str, object]:
        return hook_body("cc-budget-post", event, tool_use_id, **extra)

    for tool_use_id in ("t1", "t2"):
        allowed = client.post(
            url, json.dumps(hook("PreToolUse", tool_use_id)), content_type="application/json"
        )
        assert allowed.json()["hookSpecificOutput"]["permissionDecision"] == "allow"
    first = hook("PostToolUse", "t1", tool_response={"content": "one"})
    assert client.post(url, json.dumps(first), content_type="application/json").json() == {}
    with CaptureQueriesContext(connection) as queries:
        second = hook("PostToolUse", "t2", tool_response={"content": "print('hi')"})
        response = client.post(url, json.dumps(second), content_type="application/json")
    assert response.status_code == 200 and response.json() == {}
    call = ToolCall.objects.get(tool_use_id="t2")
    assert call.status == Status.REPORTED and "print('hi')" in call.content
    sql = statements(queries)
    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK")
    data = [s for s in sql if not s.startswith(control)]
    # The session (token checked) with its agent; the call by its tool_use_id; the call
    # locked; its conditional update with the chain head's lock (two statements on
    # SQLite); the event and head update in one statement (two on SQLite).
    assert len(data) == (5 if connection.vendor == "postgresql" else 7), data
    if connection.vendor == "postgresql":
        assert [s for s in sql if s.startswith(control)] == ["BEGIN", "COMMIT"], sql


@pytest.mark.django_db(transaction=True)
def test_the_organizations_and_teams_layers_cost_no_statement_once_parsed() -> None:
    """The layers' revisions are read with the session; parsed layers are kept by revision,
    so admission with an organization's and a team's layer costs what it did without."""
    from dispatcher.policy import managed
    from teams.models import Team

    fx = make_agent(mode="trusted")
    managed.set_layer(
        team=None, document={"deny": ["read_file(**/.env)"]}, actor="cli", reason="budget"
    )
    managed.set_layer(team=Team.objects.default(), document={"max_mode": "trusted"}, actor="cli")
    session = agents.start_session(agent=fx.agent)
    client = Client(headers=fx.headers)
    url = f"/api/v1/sessions/{session.pk}/calls"

    def post(call_id: str) -> list[str]:
        body = {"calls": [{"id": call_id, "name": "list_directory", "arguments": {"path": "."}}]}
        with CaptureQueriesContext(connection) as queries:
            response = client.post(url, json.dumps(body), content_type="application/json")
        assert response.json()["calls"][0]["status"] in ("queued", "denied"), response.content
        control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK")
        return [s for s in statements(queries) if not s.startswith(control)]

    post("warm")  # (a process that has not seen these revisions reads the layers once)
    data = post("b1")
    assert len(data) == (4 if connection.vendor == "postgresql" else 6), data
    call = ToolCall.objects.get(session=session, tool_use_id="b1")
    assert call.provenance["layers"] == {"org": 1, "team:default": 1}
    # A changed layer is read again, once, and decides at once.
    managed.set_layer(
        team=None, document={"deny": ["list_directory"]}, actor="cli", reason="budget 2"
    )
    body = {"calls": [{"id": "b2", "name": "list_directory", "arguments": {"path": "."}}]}
    response = client.post(url, json.dumps(body), content_type="application/json")
    assert response.json()["calls"][0]["status"] == "denied"
    # The worker's read carries the revisions too, and a ceiling lowered since admission
    # stops the queued call (the mode ceiling guard).
    managed.set_layer(team=None, document={"max_mode": "locked"}, actor="cli", reason="stop")
    execution.execute_call(str(call.pk))
    stopped = ToolCall.objects.get(pk=call.pk)
    assert stopped.status == Status.DENIED, stopped.reason
    assert "capped at locked by the organization's max_mode (org policy v3)" in stopped.reason
    post("after")  # (parsed again, once)


@pytest.mark.django_db(transaction=True)
def test_with_the_sources_tables_unreadable_a_message_is_still_counted_and_decided() -> None:
    """The repeat count's read also reads the upstream tools' generation; when the sources
    tables cannot be read, the counts are read alone and the lookups find no upstream tool
    (docs/mcp.md, "What fails closed"): a built-in call is still admitted, an upstream
    tool's name is unknown, and nothing is stale."""
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)

    def message(tool_use_id: str, name: str) -> list[ProposedCall]:
        arguments = {"path": "."}
        return [ProposedCall(tool_use_id, name, canonical_json(arguments), arguments)]

    admission.submit_calls(
        session=session, dialect="native", proposed=message("b1", "list_directory")
    )
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"ALTER TABLE {quote('sources_generation')} RENAME TO {quote('sources_away')}"
        )
    try:
        [builtin] = admission.submit_calls(
            session=session, dialect="native", proposed=message("b2", "list_directory")
        )
        [upstream] = admission.submit_calls(
            session=session, dialect="native", proposed=message("u1", "up__list_directory")
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                f"ALTER TABLE {quote('sources_away')} RENAME TO {quote('sources_generation')}"
            )
    assert (builtin.status, builtin.repeat_count) == (Status.QUEUED, 2)
    assert upstream.status == Status.REJECTED and "up__list_directory" in upstream.content
