"""floor.compiled: a hot read compiled once gives what its QuerySet gives, every time,
on both backends, and refuses a read whose SQL would freeze a value it was not given."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import Model
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import ApprovalRequest
from audit.models import AuditChain
from dispatcher import agents
from dispatcher.models import ToolCall
from dispatcher.policy.models import SessionGrant
from floor import compiled
from floor.compiled import Compiled, NotCompilable, save_fields
from tests.support.factories import make_agent, submit_one

pytestmark = pytest.mark.django_db


def fields_of(obj: Model) -> dict[str, Any]:
    return {k: v for k, v in obj.__dict__.items() if not k.startswith("_")}


def test_the_session_read_gives_the_querysets_instances_and_related_objects() -> None:
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    prefix, digest = fx.agent.token_prefix, fx.agent.token_hash
    compiled = Compiled(lambda p, d, pk: agents._loaded_sessions(p, d).filter(pk=pk)[:1])
    for _ in range(2):  # the compile, then a run of the kept plan
        got = compiled.first(prefix, digest, session.pk)
        want = agents._loaded_sessions(prefix, digest).filter(pk=session.pk).first()
        assert got is not None and want is not None
        assert fields_of(got) == fields_of(want)
        assert fields_of(got.agent) == fields_of(want.agent)
        assert fields_of(got.agent.owner) == fields_of(want.agent.owner)
        profile, wanted = got.agent.owner.permission_profile, want.agent.owner.permission_profile
        assert fields_of(profile) == fields_of(wanted)
        assert isinstance(got.pk, uuid.UUID) and got.has_grants is False  # type: ignore[attr-defined]


def test_values_are_never_frozen_by_the_first_compile() -> None:
    """Other arguments give other rows; a grant given, then revoked, shows at once."""
    one, two = make_agent(mode="trusted"), make_agent(mode="trusted")
    first = agents.start_session(agent=one.agent)
    second = agents.start_session(agent=two.agent)
    assert agents.session_for_token(one.token, first.pk) == first
    assert agents.session_for_token(two.token, second.pk) == second
    assert agents.session_for_token(one.token, second.pk) is None  # another agent's session
    assert agents.session_for_token(two.token, first.pk) is None
    grant = SessionGrant.objects.create(session=first, rule="run_command(make)", tool="x")
    assert agents.session_for_token(one.token, first.pk).has_grants is True  # type: ignore[union-attr]
    SessionGrant.objects.filter(pk=grant.pk).update(revoked_at=timezone.now())
    assert agents.session_for_token(one.token, first.pk).has_grants is False  # type: ignore[union-attr]
    one.agent.is_active = False
    one.agent.save()
    assert agents.session_for_token(one.token, first.pk) is None  # a revoked agent's token


def test_a_list_argument_has_a_plan_per_length() -> None:
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    calls = [
        submit_one(session, "list_directory", {"path": "."}, tool_use_id=f"t{i}") for i in range(3)
    ]
    compiled = Compiled(lambda ids: ToolCall.objects.filter(pk__in=ids).order_by("batch_index"))
    assert [c.pk for c in compiled.all([calls[0].pk])] == [calls[0].pk]
    assert {c.pk for c in compiled.all([calls[2].pk, calls[1].pk])} == {calls[1].pk, calls[2].pk}
    assert len(compiled.all([c.pk for c in calls])) == 3
    assert compiled.all([uuid.uuid4()]) == []
    got = compiled.all([calls[1].pk])[0]
    assert fields_of(got) == fields_of(ToolCall.objects.get(pk=calls[1].pk))  # JSON, datetimes


def test_a_run_is_one_statement() -> None:
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    agents.session_for_token(fx.token, session.pk)
    with CaptureQueriesContext(connection) as queries:
        assert agents.session_for_token(fx.token, session.pk) == session
    assert len(queries) == 1, queries.captured_queries


def test_an_integer_argument_of_a_32_bit_column_is_a_statement_that_matches() -> None:
    """The placeholder an int is compiled with must fit the column: Django answers a lookup
    outside an integer column's range with no statement at all, and a plan compiled that
    way would answer nothing for every later value (every reviewer refused)."""
    from django.contrib.auth.models import Group

    from tests.support.factories import make_user

    user = make_user("compiled-int", groups=("reviewer",))
    holds = Compiled(
        lambda user_id, role: Group.objects.filter(user__id=user_id, name=role).values_list("name")[
            :1
        ]
    )
    with CaptureQueriesContext(connection) as queries:
        assert holds.tuples(user.pk, "reviewer") == [("reviewer",)]
        assert holds.tuples(user.pk, "admin") == []
    assert len(queries) == 2, queries.captured_queries


def test_values_a_builder_makes_up_are_refused_when_compiled() -> None:
    """A clock read, a derived pattern or a made-up id would otherwise be replayed forever."""
    clock = Compiled(
        lambda session_id: ToolCall.objects.filter(
            session_id=session_id, created_at__lt=timezone.now()
        )
    )
    with pytest.raises(NotCompilable, match="not one of the read's arguments"):
        clock.all(uuid.uuid4())
    pattern = Compiled(lambda name: ToolCall.objects.filter(name__contains=name))
    with pytest.raises(NotCompilable):
        pattern.all("list")
    made_up = Compiled(lambda name: ToolCall.objects.filter(name=name, batch_id=uuid.uuid4()))
    with pytest.raises(NotCompilable):
        made_up.all("list")
    with pytest.raises(NotCompilable, match="bool"):
        Compiled(lambda flag: ToolCall.objects.filter(is_error=flag)).all(True)
    # Passed in, the clock is a value of each run:
    now = Compiled(
        lambda session_id, at: ToolCall.objects.filter(session_id=session_id, created_at__lt=at)
    )
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    call = submit_one(session, "list_directory", {"path": "."})
    assert now.all(session.pk, call.created_at) == []
    assert now.all(session.pk, timezone.now()) == [call]


@pytest.mark.django_db(transaction=True)
def test_a_locking_read_still_needs_a_transaction() -> None:
    head = Compiled(lambda chain: AuditChain.objects.select_for_update().filter(chain=chain)[:1])
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    with transaction.atomic():
        assert head.first(str(session.pk)) is not None
    if connection.features.has_select_for_update:
        with pytest.raises(TransactionManagementError):
            head.first(str(session.pk))


def test_an_empty_list_matches_nothing_without_a_query() -> None:
    compiled = Compiled(lambda ids: ToolCall.objects.filter(pk__in=ids).order_by())
    with CaptureQueriesContext(connection) as queries:
        assert compiled.all([]) == []
    assert queries.captured_queries == []
    assert list(ToolCall.objects.filter(pk__in=[])) == []  # as the ORM answers it


def test_insert_writes_the_rows_bulk_create_would_and_keeps_unique_errors() -> None:
    from django.db import IntegrityError

    from floor import compiled

    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    model = submit_one(session, "list_directory", {"path": "."}, "model-call")
    fresh = ToolCall.objects.get(pk=model.pk)

    def copy(tool_use_id: str) -> ToolCall:
        values = {f.attname: getattr(fresh, f.attname) for f in ToolCall._meta.concrete_fields}
        values.update(id=uuid.uuid4(), tool_use_id=tool_use_id)
        return ToolCall(**values)

    ours, theirs = [copy("ours-1"), copy("ours-2")], [copy("theirs-1"), copy("theirs-2")]
    with CaptureQueriesContext(connection) as queries:
        compiled.insert(ours)
    assert len([q for q in queries.captured_queries if "INSERT" in q["sql"]]) == 1
    ToolCall.objects.bulk_create(theirs)
    for a, b in zip(ours, theirs, strict=True):
        mine, other = ToolCall.objects.get(pk=a.pk), ToolCall.objects.get(pk=b.pk)
        skip = {"id", "tool_use_id", "created_at", "updated_at"}
        assert {k: v for k, v in fields_of(mine).items() if k not in skip} == {
            k: v for k, v in fields_of(other).items() if k not in skip
        }
        assert not a._state.adding
    with pytest.raises(IntegrityError), transaction.atomic():
        compiled.insert([copy("ours-1")])  # one call per (session, tool_use_id)


def test_a_value_left_to_the_database_default_goes_to_bulk_create() -> None:
    """A column with a database default is compiled while the object carries a value; one
    left to the database (DatabaseDefault) is bulk_create's, which writes DEFAULT."""
    from django.db.models import Value
    from django.db.models.expressions import DatabaseDefault

    from floor import compiled

    session = agents.start_session(agent=make_agent(mode="trusted").agent)
    fresh = ToolCall.objects.get(pk=submit_one(session, "list_directory", {"path": "."}).pk)

    def copy(**changes: Any) -> ToolCall:
        values = {f.attname: getattr(fresh, f.attname) for f in ToolCall._meta.concrete_fields}
        values.update(id=uuid.uuid4(), tool_use_id=uuid.uuid4().hex, **changes)
        return ToolCall(**values)

    assert compiled.insert_statement([copy()]) is not None
    assert compiled.insert_statement([copy(batch_all_sent=DatabaseDefault(Value(False)))]) is None
    left = copy(batch_all_sent=DatabaseDefault(Value(False)), batch_size=DatabaseDefault(Value(0)))
    compiled.insert([left])
    stored = ToolCall.objects.get(pk=left.pk)
    assert stored.batch_all_sent is False and stored.batch_size == 0


def test_save_fields_writes_those_columns_as_save_would_and_nothing_else() -> None:
    from approvals.models import ApprovalRequest

    session = agents.start_session(agent=make_agent(mode="standard").agent)
    call = submit_one(session, "write_file", {"path": "f.txt", "content": "x"})
    approval = ApprovalRequest.objects.get(call=call)
    reviewer = make_agent().owner
    names = ["decision", "decided_by", "decided_at", "feedback", "digest_seen"]
    approval.decision, approval.decided_by, approval.decided_at = (
        "approved",
        reviewer,
        timezone.now(),
    )
    approval.feedback, approval.digest_seen = "fine <b>", call.digest
    approval.reason = "not written: not among the names"
    with CaptureQueriesContext(connection) as queries:
        save_fields(approval, names)
    assert len(queries) == 1 and queries[0]["sql"].startswith('UPDATE "approvals_approvalrequest"')
    stored = ApprovalRequest.objects.get(pk=approval.pk)
    assert {n: getattr(stored, n) for n in names} == {n: getattr(approval, n) for n in names}
    assert stored.reason != approval.reason
    ApprovalRequest.objects.filter(pk=approval.pk).delete()
    with pytest.raises(ApprovalRequest.NotUpdated, match="did not affect any rows"):
        save_fields(approval, names)
    assert issubclass(ApprovalRequest.NotUpdated, DatabaseError)  # (as save raises it)


def test_create_writes_the_row_objects_create_would_in_one_statement() -> None:
    """compiled.create (an ask's approval row): its own one INSERT ... RETURNING, the same
    row as `objects.create` writes, the key set from the database, errors as save raises."""
    trusted = agents.start_session(agent=make_agent(mode="trusted").agent)
    mine, other = (
        submit_one(trusted, "list_directory", {"path": "."}, name)  # (ask for no approval)
        for name in ("mine", "other")
    )
    values: dict[str, Any] = {
        "reason": "asks <b>",
        "asked_by": "rule:7",
        "presentation": {"kind": "diff", "n": [1]},
        "digest": "d" * 64,
        "expires_at": timezone.now(),
        "approvals_required": 2,
        "group": "ops",
    }
    theirs = ApprovalRequest.objects.create(call=other, **values)
    ours = ApprovalRequest(call=mine, **values)
    with CaptureQueriesContext(connection) as queries:
        compiled.create(ours)
    # Its own statement (the ORM's ends with a table-qualified `RETURNING "...".id`).
    assert len(queries) == 1 and queries[0]["sql"].endswith('RETURNING "id"')
    assert isinstance(ours.pk, int) and ours.pk > theirs.pk and not ours._state.adding
    skip = {"id", "call_id", "created_at"}
    stored = ApprovalRequest.objects.get(pk=ours.pk)
    assert {k: v for k, v in fields_of(stored).items() if k not in skip} == {
        k: v for k, v in fields_of(theirs).items() if k not in skip
    }
    assert stored.call_id == mine.pk and stored.created_at == ours.created_at
    with pytest.raises(IntegrityError), transaction.atomic():
        compiled.create(ApprovalRequest(call=mine, **values))  # one request per call
