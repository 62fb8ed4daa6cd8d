"""Building chains for tests: through record_event, or fast with bulk_create."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import EventSpec, linked_events, record_event


def write_chain(length: int, session_id: uuid.UUID | None = None) -> list[AuditEvent]:
    session_id = session_id or uuid.uuid4()
    events = []
    with transaction.atomic():
        events.append(
            record_event(
                kind="session.started",
                actor="agent:test",
                session_id=session_id,
                payload={"agent": "test", "owner": "tester", "title": "t", "mode": "standard"},
            )
        )
        for n in range(1, length):
            events.append(
                record_event(
                    kind="call.received",
                    actor="agent:test",
                    subject=f"call:{n}",
                    session_id=session_id,
                    payload={"call_id": str(n), "tool": "read_file", "arguments": f'{{"n": {n}}}'},
                )
            )
    return events


def bulk_chain(count: int, chain: str | None = None, batch_size: int = 5000, pad: str = "") -> str:
    """Insert `count` valid events fast (no heads, no summary), each with `pad` in its
    payload when given (a bigger export). Returns the chain id."""
    session_id = uuid.uuid4()
    chain = chain or str(session_id)
    start = timezone.now()
    specs = (
        EventSpec(
            "call.received",
            "agent:bulk",
            f"call:{seq}",
            {"call_id": str(seq), "tool": "read_file", "n": seq} | ({"pad": pad} if pad else {}),
            start + timedelta(microseconds=seq),
        )
        for seq in range(1, count + 1)
    )
    batch: list[AuditEvent] = []
    for event in linked_events(specs, chain=chain, session_id=session_id):
        batch.append(event)
        if len(batch) >= batch_size:
            AuditEvent.objects.bulk_create(batch)
            batch = []
    AuditEvent.objects.bulk_create(batch)
    return chain
