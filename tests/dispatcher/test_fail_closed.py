"""No decision or execution without its committed audit event (docs/audit.md).

A trigger makes every audit INSERT fail; each state change must then fail with it and
leave nothing behind: no call stored, no decision taken, nothing executed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.test import Client

from dispatcher import agents, execution, transitions
from dispatcher.models import Status, ToolCall
from tests.support.factories import make_agent, submit_one

pytestmark = pytest.mark.django_db


def break_the_audit_log() -> None:
    """Every audit INSERT fails from now until the test ends (the DDL rolls back with it)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION test_audit_down() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'audit store unavailable'; END $$"
            )
            cursor.execute(
                "CREATE TRIGGER test_audit_down BEFORE INSERT ON audit_auditevent "
                "FOR EACH ROW EXECUTE FUNCTION test_audit_down()"
            )
        else:
            cursor.execute(
                "CREATE TRIGGER test_audit_down BEFORE INSERT ON audit_auditevent "
                "BEGIN SELECT RAISE(ABORT, 'audit store unavailable'); END"
            )


def test_a_call_is_not_admitted_when_its_audit_event_cannot_be_written(client: Client) -> None:
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    body = {
        "calls": [{"id": "a", "name": "write_file", "arguments": {"path": "f.txt", "content": "x"}}]
    }
    break_the_audit_log()
    response = client.post(
        f"/api/v1/sessions/{session.pk}/calls",
        body,
        content_type="application/json",
        headers=fx.headers,
    )
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "storage_unavailable"
    assert "nothing was decided" in response.json()["error"]["message"]
    assert not ToolCall.objects.filter(session=session).exists()
    assert not (Path(session.workspace) / "f.txt").exists()


def test_an_approval_is_not_taken_when_its_audit_event_cannot_be_written() -> None:
    fx = make_agent(mode="standard")
    session = agents.start_session(agent=fx.agent)
    call = submit_one(session, "write_file", {"path": "f.txt", "content": "x"})
    assert call.status == Status.PENDING_APPROVAL
    break_the_audit_log()
    # (A decision takes no savepoint of its own: a failed one fails the transaction it
    # joins, here one of the test's, so that the test's own goes on.)
    with pytest.raises(DatabaseError), transaction.atomic():
        transitions.approve_call(call_id=call.pk, actor="user:rita")
    assert ToolCall.objects.get(pk=call.pk).status == Status.PENDING_APPROVAL


def test_a_call_is_not_executed_when_its_start_cannot_be_audited() -> None:
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    call = submit_one(session, "write_file", {"path": "f.txt", "content": "x"})
    assert call.status == Status.QUEUED
    break_the_audit_log()
    with pytest.raises(DatabaseError):
        execution.execute_call(str(call.pk))
    assert ToolCall.objects.get(pk=call.pk).status == Status.QUEUED
    assert not (Path(session.workspace) / "f.txt").exists()


@pytest.fixture
def broker_down() -> Iterator[None]:
    """The Celery broker refuses connections (a real closed port, not a stub). The app's
    connection and producer pools are rebuilt on both sides, so later tests get the real
    broker back."""
    from harness_site.celery import app

    def fresh_pools(close: bool) -> None:
        # kombu keeps one pool per broker URL for the whole process: close only the dead
        # broker's, never the real one's (later tests publish through it).
        if close and app._pool is not None:
            app._pool.force_close_all()
        app._pool = None
        app.amqp._producer_pool = None

    saved = (app.conf.broker_url, app.conf.broker_transport_options, app.conf.task_publish_retry)
    fresh_pools(close=False)
    app.conf.broker_url = "redis://127.0.0.1:9/0"  # discard port: nothing listens
    app.conf.broker_transport_options = {"max_retries": 0}
    app.conf.task_publish_retry = False
    try:
        yield
    finally:
        fresh_pools(close=True)
        (
            app.conf.broker_url,
            app.conf.broker_transport_options,
            app.conf.task_publish_retry,
        ) = saved


@pytest.mark.django_db(transaction=True)
def test_a_broker_outage_leaves_an_admitted_call_queued_for_the_reconciler(
    broker_down: None,
) -> None:
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    body = {"calls": [{"id": "b1", "name": "list_directory", "arguments": {"path": "."}}]}
    response = Client(headers=fx.headers).post(
        f"/api/v1/sessions/{session.pk}/calls", json.dumps(body), content_type="application/json"
    )
    # Decided and stored: the agent is told so, not that nothing happened.
    assert response.status_code == 202, response.content
    assert response.json()["calls"][0]["status"] == "queued"
    call = ToolCall.objects.get(session=session)
    assert call.status == Status.QUEUED and call.enqueued_at is not None
    # The reconciler re-sends it once it is stale (HARNESS_REQUEUE_AFTER).
    stale = call.enqueued_at - timedelta(seconds=settings.HARNESS_REQUEUE_AFTER + 1)
    ToolCall.objects.filter(pk=call.pk).update(queued_at=stale, enqueued_at=stale)
    assert execution.reconcile()["resent"] == 1
