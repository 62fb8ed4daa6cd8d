"""An event's payload encoded once for its hash and its row (audit.services
`_canonical_around`, `_append_in_one_statement`): the hashed text is byte for byte
`canonical_event`'s, and the stored payload is the same JSONB value the ORM's own
parameter gave, for payloads of every shape audit_copy makes."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.db import connection, transaction
from hypothesis import example, given, settings
from hypothesis import strategies as st

from audit import services
from audit.models import AuditEvent
from audit.services import EventSpec, audit_copy, canonical_event, record_events
from audit.verify import verify_database

texts = st.text(max_size=20)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
payloads = st.dictionaries(
    texts, st.recursive(leaves, lambda inner: st.dictionaries(texts, inner, max_size=4)), max_size=6
)


@settings(max_examples=400, deadline=None)
@given(
    payload=payloads,
    chain=texts,
    seq=st.integers(min_value=0),
    kind=texts,
    actor=texts,
    subject=texts,
    created_at=texts,
)
@example(
    payload={"é": 'q"\\\n\u2028', "b": {"z": 1.5, "a": [1]}, "a": None},
    chain="c\x00",
    seq=7,
    kind="call.received",
    actor="agent:é",
    subject='"',
    created_at="2026-12-06T19:00:00.000001+00:00",
)
def test_the_hashed_text_is_canonical_events_own(
    payload: dict[str, Any],
    chain: str,
    seq: int,
    kind: str,
    actor: str,
    subject: str,
    created_at: str,
) -> None:
    copy = audit_copy(payload)
    fields: dict[str, Any] = dict(
        chain=chain, seq=seq, kind=kind, actor=actor, subject=subject, created_at=created_at
    )
    text = services._canonical_around(copy, services._canonical_json(copy), **fields)
    assert text == canonical_event(payload=copy, **fields)
    assert text == json.dumps(
        {**fields, "payload": copy}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def test_texts_of_other_types_are_encoded_as_canonical_event_encodes_them() -> None:
    class Kind(str):
        pass

    fields: dict[str, Any] = dict(
        chain="c", seq=True, kind=Kind("k"), actor="a", subject="s", created_at="t"
    )
    text = services._canonical_around({"x": 1}, '{"x":1}', **fields)
    assert text == canonical_event(payload={"x": 1}, **fields)


@pytest.mark.django_db(transaction=True)
def test_the_stored_payload_is_the_orms_and_the_chain_verifies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    payload = {"é": 'q"\\\n', "n": {"z": 1.5, "a": 10**20, "b": [1, "x"]}, "t": True, "u": None}
    session_id = uuid.uuid4()
    with transaction.atomic():
        record_events(
            [EventSpec("call.received", "agent:a", "call:1", {"x": 1})], session_id=session_id
        )
    dumps = json.dumps
    encoded: list[Any] = []

    def counting(value: Any, *args: Any, **kwargs: Any) -> str:
        encoded.append(value)
        return dumps(value, *args, **kwargs)

    monkeypatch.setattr(json, "dumps", counting)
    with transaction.atomic():
        [event] = record_events(
            [EventSpec("call.received", "agent:a", "call:2", payload)], session_id=session_id
        )
    monkeypatch.setattr(json, "dumps", dumps)
    stored = AuditEvent.objects.get(pk=event.pk)
    assert stored.payload == audit_copy(payload) == event.payload
    assert verify_database(str(session_id)).ok
    if connection.vendor == "postgresql":
        # The same jsonb value as the ORM's parameter (json.dumps of the dict) gives; the
        # payload encoded by neither the hash's json.dumps nor the parameter's.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT payload = %s::jsonb FROM audit_auditevent WHERE id = %s",
                [dumps(event.payload), event.pk],
            )
            assert cursor.fetchone()[0] is True
        assert encoded == []


@pytest.mark.django_db(transaction=True)
def test_a_payload_replaced_after_its_hash_is_stored_as_replaced() -> None:
    """(linked_events' text goes with the payload it was made of: a payload replaced on
    the event is encoded again for the row, as before)"""
    session_id = uuid.uuid4()
    with transaction.atomic():
        record_events(
            [EventSpec("call.received", "agent:a", "call:1", {"x": 1})], session_id=session_id
        )
    with transaction.atomic():
        head = services._locked_head(str(session_id))
        assert head is not None
        [event] = services.linked_events(
            [EventSpec("call.received", "agent:a", "call:2", {"x": 2}, head.last_at)],
            chain=str(session_id),
            session_id=session_id,
            seq=head.last_seq,
            prev_hash=head.last_hash,
        )
        event.payload = {"x": 3}
        services._write(head, [event])
    assert AuditEvent.objects.get(pk=event.pk).payload == {"x": 3}
