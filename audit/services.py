"""Appending to the audit log. The only write path for AuditEvent."""

from __future__ import annotations

import hashlib
import json
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.utils import timezone

from .models import GLOBAL_CHAIN, AuditEvent

GENESIS_HASH = "0" * 64


def canonical_event(
    *, chain: str, seq: int, kind: str, actor: str, subject: str, payload: Any, created_at: str
) -> str:
    """The exact text that is hashed for one event (also what an export carries)."""
    return json.dumps(
        {
            "chain": chain,
            "seq": seq,
            "kind": kind,
            "actor": actor,
            "subject": subject,
            "payload": payload,
            "created_at": created_at,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )


def chain_hash(prev_hash: str, canonical: str) -> str:
    return hashlib.sha256((prev_hash + canonical).encode()).hexdigest()


def _lock_chain(chain: str) -> None:
    """Serialize appends to one chain. SQLite's IMMEDIATE transactions already do."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [chain])


def record_event(
    *,
    kind: str,
    actor: str,
    subject: str = "",
    payload: dict[str, Any] | None = None,
    session_id: UUID | str | None = None,
) -> AuditEvent:
    """Append one event to its chain. Must run inside the transaction of the change it records.

    Raises TransactionManagementError outside a transaction: an audit record on its own
    commit could describe a change that then rolled back (or the reverse).
    """
    if not connection.in_atomic_block:
        raise transaction.TransactionManagementError(
            "record_event must run inside transaction.atomic()"
        )
    chain = str(session_id) if session_id else GLOBAL_CHAIN
    _lock_chain(chain)
    last = (
        AuditEvent.objects.filter(chain=chain).order_by("-seq").values_list("seq", "hash").first()
    )
    seq, prev_hash = (last[0] + 1, last[1]) if last else (1, GENESIS_HASH)
    payload = json.loads(json.dumps(payload or {}, default=str))
    created_at = timezone.now()
    canonical = canonical_event(
        chain=chain,
        seq=seq,
        kind=kind,
        actor=actor,
        subject=subject,
        payload=payload,
        created_at=created_at.isoformat(),
    )
    return AuditEvent.objects.create(
        chain=chain,
        session_id=session_id,
        seq=seq,
        kind=kind,
        actor=actor,
        subject=subject,
        payload=payload,
        created_at=created_at,
        prev_hash=prev_hash,
        hash=chain_hash(prev_hash, canonical),
    )
