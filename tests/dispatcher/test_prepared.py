"""The hot paths' fixed statements are prepared on PostgreSQL (floor.compiled.
fixed_cursor, HARNESS_DB_PREPARE): PostgreSQL plans each once per connection, and they
still give what they gave, still show in the query log with their values, and are still
counted by the statement budgets. Nothing is prepared with the setting off."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from audit.verify import verify_database
from dispatcher import agents, execution
from dispatcher.models import Status, ToolCall
from floor.compiled import Compiled
from tests.support.factories import make_agent, submit_one

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _postgresql_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's (SQLite binds every statement)")


def prepared() -> list[str]:
    """The statements this connection has prepared (PostgreSQL's own view of them)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_a_call_the_worker_runs_prepares_its_statements_and_ends_as_before() -> None:
    session = agents.start_session(agent=make_agent(mode="trusted").agent)
    call = submit_one(session, "list_directory", {"path": "."})
    assert call.status == Status.QUEUED
    execution.execute_call(str(call.pk))
    call.refresh_from_db()
    assert call.status == Status.COMPLETED and not call.is_error
    texts = prepared()
    # The claim's and the result's writes with the head's lock, the audit append, the
    # worker's read of the call: each on the server, with placeholders.
    assert any(t.startswith('WITH written AS (UPDATE "dispatcher_toolcall"') for t in texts)
    assert any(t.startswith('WITH new_events AS (INSERT INTO "audit_auditevent"') for t in texts)
    assert any('FROM "dispatcher_toolcall"' in t and "$1" in t for t in texts)
    assert verify_database().ok


def test_nothing_is_prepared_with_the_setting_off() -> None:
    # A read of its own text: its list's length is in the SQL (IN ($1, ..., $n)), and no
    # other test reads that many.
    read = Compiled(lambda pks: ToolCall.objects.filter(pk__in=pks))
    with override_settings(HARNESS_DB_PREPARE=False):
        assert read.all([uuid.uuid4() for _ in range(337)]) == []
    assert not [t for t in prepared() if "$337)" in t]
    assert read.all([uuid.uuid4() for _ in range(338)]) == []
    assert [t for t in prepared() if "$338)" in t]


def test_the_query_log_shows_a_prepared_statement_with_its_values() -> None:
    session = agents.start_session(agent=make_agent(mode="trusted").agent)
    call = submit_one(session, "list_directory", {"path": "."})
    read = Compiled(lambda pk: ToolCall.objects.filter(pk=pk))
    with CaptureQueriesContext(connection) as queries:
        found = read.all(call.pk)
        again = read.all(call.pk)
    assert [c.pk for c in found] == [call.pk] and [c.pk for c in again] == [call.pk]
    assert len(queries) == 2
    logged = queries[1]["sql"]
    assert logged.startswith('SELECT "dispatcher_toolcall"."id"')
    assert call.pk.hex in logged.replace("-", "")
    assert "$1" not in logged
    # Read back through the prepared statement, every column is what the ORM reads.
    orm = ToolCall.objects.get(pk=call.pk)
    assert {f.attname: getattr(found[0], f.attname) for f in ToolCall._meta.concrete_fields} == {
        f.attname: getattr(orm, f.attname) for f in ToolCall._meta.concrete_fields
    }
    assert found[0].created_at.tzinfo is not None


def test_an_insert_of_many_rows_is_prepared_only_once_it_recurs() -> None:
    # An INSERT's text and parameter types vary with its rows (each NULL a type of its
    # own): one of several rows waits for psycopg's count instead of filling the cache of
    # prepared statements with statements run once.
    session = agents.start_session(agent=make_agent(mode="trusted").agent)
    before = [
        t for t in prepared() if t.startswith('WITH written AS (INSERT INTO "dispatcher_toolcall"')
    ]
    submit_many(session, 3)
    after = [
        t for t in prepared() if t.startswith('WITH written AS (INSERT INTO "dispatcher_toolcall"')
    ]
    assert len(after) == len(before)
    submit_many(session, 1)
    single = [
        t for t in prepared() if t.startswith('WITH written AS (INSERT INTO "dispatcher_toolcall"')
    ]
    assert len(single) == len(after) + 1


def submit_many(session: object, n: int) -> None:
    from dispatcher import admission
    from dispatcher.gateways.dialects import ProposedCall, canonical_json

    token = uuid.uuid4().hex
    proposed = [
        ProposedCall(
            f"m-{token}-{i}", "list_directory", canonical_json({"path": "."}), {"path": "."}
        )
        for i in range(n)
    ]
    admission.submit_calls(session=session, dialect="native", proposed=proposed)


@pytest.mark.django_db(transaction=True)
def test_a_migration_that_changes_a_column_type_does_not_break_the_connection() -> None:
    # PostgreSQL refuses a prepared statement whose result columns changed type
    # ("cached plan must not change result type"); psycopg forgets its statements only on
    # a rollback. Outside a transaction the statement runs again, prepared anew; inside
    # one the transaction fails once, and the next one works.
    from django.db import DatabaseError, transaction

    from dispatcher.models import Agent

    agent = make_agent(mode="trusted").agent
    read = Compiled(lambda pk: Agent.objects.filter(pk=pk))
    assert [a.pk for a in read.all(agent.pk)] == [agent.pk]
    alter(101)  # (by another connection, as a migration would)
    try:
        assert [a.name for a in read.all(agent.pk)] == [agent.name]  # autocommit: again
        alter(102)
        with pytest.raises(DatabaseError), transaction.atomic():
            read.all(agent.pk)
        with transaction.atomic():
            assert [a.name for a in read.all(agent.pk)] == [agent.name]
    finally:
        alter(100)


def alter(length: int) -> None:
    """Change the agent's name column's type from another connection."""
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute(f'ALTER TABLE "dispatcher_agent" ALTER COLUMN "name" TYPE varchar({length})')
