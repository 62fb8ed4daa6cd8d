"""The floor of Harness's guarantees alone: what S5 and S6 would cost with nothing else.

A guaranteed execution is two durable transitions of the call's row (the claim, committed
before the tool runs, and the result), each with its audit event appended to the session's
hash chain under the chain's lock and the new head signed, and one wake-up published. This
module does exactly that and nothing more, with one psycopg connection per process and
two statements per transition (the call's conditional UPDATE with the head's lock in one
`WITH`, the same statement Harness sends; the event's INSERT with the head's UPDATE in one
`WITH`), against the real tables and their indexes, with the real hash and signature
functions. No ORM, no pool checkout, no policy, no guards, no masking, no tool.

F (the floor side of S5 and S6) runs it where Harness runs its own: the worker's
transitions in a Celery task on the same worker (`bench.tasks.floor_execute`), S5's
decision in the bench process before the message is sent. P / F is then Harness's own
cost above its guarantees, and F / B how far the guarantees alone are from raw Celery:
a target above F / B cannot be reached on this stack without giving up a guarantee.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import uuid
from typing import Any

import psycopg

from audit.services import canonical_event, chain_hash
from audit.signing import sign_head

LOCK = (
    "WITH written AS (UPDATE dispatcher_toolcall SET status = %s, {column} = %s "
    "WHERE id = %s AND status = %s RETURNING 1) "
    "SELECT last_seq, last_hash FROM audit_auditchain "
    "WHERE chain = %s AND (SELECT count(*) FROM written) > 0 FOR UPDATE"
)
APPEND = (
    "WITH e AS (INSERT INTO audit_auditevent "
    "(chain, session_id, seq, kind, actor, subject, payload, created_at, prev_hash, hash) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id) "
    "UPDATE audit_auditchain SET last_seq = %s, last_hash = %s, last_at = %s, "
    "head_signature = %s, last_event_id = (SELECT id FROM e) WHERE chain = %s"
)
COLUMN = {"queued": "queued_at", "running": "started_at", "completed": "finished_at"}
KIND = {"queued": "call.approved", "running": "call.started", "completed": "call.completed"}


@functools.cache
def connection() -> psycopg.Connection[Any]:
    """This process's own connection (autocommit; each transition is its own transaction)."""
    return psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)


def event_row(
    chain: str,
    session: uuid.UUID,
    seq: int,
    prev: str,
    kind: str,
    actor: str,
    subject: str,
    payload: dict[str, Any],
    at: dt.datetime,
) -> tuple[list[Any], str]:
    """One event's row values, in the order of audit_auditevent's columns in APPEND
    (chain, session_id, seq, kind, actor, subject, payload, created_at, prev_hash, hash),
    and its hash: chained and hashed as audit.services does."""
    digest = chain_hash(
        prev,
        canonical_event(
            chain=chain,
            seq=seq,
            kind=kind,
            actor=actor,
            subject=subject,
            payload=payload,
            created_at=at.isoformat(),
        ),
    )
    return [
        chain,
        session,
        seq,
        kind,
        actor,
        subject,
        json.dumps(payload),
        at,
        prev,
        digest,
    ], digest


def transition(call_id: str, chain: str, before: str, after: str) -> None:
    """One durable transition of a call with its audit event, as one transaction."""
    conn = connection()
    now = dt.datetime.now(dt.UTC)
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(LOCK.format(column=COLUMN[after]), (after, now, call_id, before, chain))
        head = cur.fetchone()
        if head is None:
            raise RuntimeError(
                f"floor: call {call_id} was not {before} (or chain {chain} has no head)"
            )
        seq, prev = head[0] + 1, head[1]
        payload = {"call": call_id, "status": after}
        row, digest = event_row(
            chain, uuid.UUID(chain), seq, prev, KIND[after], "worker", call_id, payload, now
        )
        cur.execute(APPEND, (*row, seq, digest, now, sign_head(chain, seq, digest), chain))
