"""Appending to the audit log. The only write path for AuditEvent.

Every event of a call's life (call.received to its result: the call.* kinds) has the
subject "call:<call id>": the session timeline (audit.timeline.call_page) finds a page's
calls by it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple
from uuid import UUID

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, models, transaction
from django.utils import timezone
from psycopg.types.json import Jsonb

from floor.compiled import Binder, Compiled, binder, fixed_cursor

from . import kinds
from .masking import (
    Masked,
    contains_masked,
    is_secret_key,
    mask_secrets,
    mask_text,
    masked_item,
    storable,
)
from .models import GLOBAL_CHAIN, AuditChain, AuditEvent
from .signing import sign_head

GENESIS_HASH = "0" * 64


def canonical_event(
    *, chain: str, seq: int, kind: str, actor: str, subject: str, payload: Any, created_at: str
) -> str:
    """The exact text that is hashed for one event (also what an export carries)."""
    return _canonical_json(
        {
            "chain": chain,
            "seq": seq,
            "kind": kind,
            "actor": actor,
            "subject": subject,
            "payload": payload,
            "created_at": created_at,
        }
    )


# json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False), with its
# encoder made once (json.dumps makes one per call when given options).
_canonical_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode
_json_text = json.encoder.encode_basestring  # (a text as that encoder writes it)


def _canonical_around(
    payload: Any,
    payload_text: str,
    *,
    chain: str,
    seq: int,
    kind: str,
    actor: str,
    subject: str,
    created_at: str,
) -> str:
    """`canonical_event`'s text around the payload's own canonical text (the same bytes:
    the encoder writes a nested dict as it writes it alone, and the event's keys in sorted
    order are these), so that the payload is encoded once for the hash and the INSERT."""
    if type(seq) is not int or not all(
        type(text) is str for text in (chain, kind, actor, subject, created_at)
    ):  # (anything else: as canonical_event encodes it)
        return canonical_event(
            chain=chain,
            seq=seq,
            kind=kind,
            actor=actor,
            subject=subject,
            payload=payload,
            created_at=created_at,
        )
    return (
        f'{{"actor":{_json_text(actor)},"chain":{_json_text(chain)},'
        f'"created_at":{_json_text(created_at)},"kind":{_json_text(kind)},'
        f'"payload":{payload_text},"seq":{seq},"subject":{_json_text(subject)}}}'
    )


def chain_hash(prev_hash: str, canonical: str) -> str:
    return hashlib.sha256((prev_hash + canonical).encode()).hexdigest()


def _lock_chain(chain: str) -> None:
    """Serialize appends to one chain. SQLite's IMMEDIATE transactions already do."""
    if connection.vendor == "postgresql":
        with fixed_cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [chain])


class EventSpec(NamedTuple):
    """One event to append: what happened, who did it, to what, and when (default: now)."""

    kind: str
    actor: str
    subject: str = ""
    payload: dict[str, Any] | None = None
    at: datetime | None = None


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
    return record_events([EventSpec(kind, actor, subject, payload)], session_id=session_id)[0]


def record_events(
    specs: Sequence[EventSpec],
    *,
    session_id: UUID | str | None = None,
    locked_head: AuditChain | None = None,
) -> list[AuditEvent]:
    """Append events to one chain, in order: one head lock, one INSERT, one head update
    (three statements whatever the number of events). Same rules as record_event.

    Payloads are masked before the chain is locked (text already masked with
    audit.masking.premask, e.g. before the caller's transaction opened, is kept as it is).
    `locked_head`: the chain's head as `write_and_lock_head` locked it in this transaction
    (the lock is then not taken again).
    """
    if not connection.in_atomic_block:
        raise transaction.TransactionManagementError(
            "record_event must run inside transaction.atomic()"
        )
    if not specs:
        return []
    for spec in specs:
        kinds.get(spec.kind)  # UnknownKind: nothing is written under a misspelt kind
    payloads = [audit_copy(spec.payload or {}) for spec in specs]
    chain = str(session_id) if session_id else GLOBAL_CHAIN
    if locked_head is not None and locked_head.chain != chain:
        raise ValueError("the locked head is another chain's")
    head = locked_head or _locked_head(chain)
    # UTC always: the hashed text is isoformat(), and exports write it in UTC. Never
    # earlier than the event before it: times only move forward along a chain, also when
    # `at` was taken before another process's append won the chain lock.
    last_at = head.last_at if head else None
    stored = []
    for spec, payload in zip(specs, payloads, strict=True):
        at = spec.at.astimezone(UTC) if spec.at else timezone.now()
        last_at = at if last_at is None else max(at, last_at)
        stored.append(spec._replace(payload=payload, at=last_at))
    events = list(
        linked_events(
            stored,
            chain=chain,
            session_id=session_id,
            seq=head.last_seq if head else 0,
            prev_hash=head.last_hash if head else GENESIS_HASH,
        )
    )
    _write(head, events)
    return events


def linked_events(
    specs: Iterable[EventSpec],
    *,
    chain: str,
    session_id: UUID | str | None,
    seq: int = 0,
    prev_hash: str = GENESIS_HASH,
) -> Iterator[AuditEvent]:
    """The unsaved events for `specs`, in order, after the chain's event number `seq` with
    hash `prev_hash`: numbered and hash-linked. Payloads and times are taken as given
    (record_events masks and times them; test and bench loaders build chains with it)."""
    for spec in specs:
        seq += 1
        payload = spec.payload or {}
        created_at = spec.at or timezone.now()
        payload_text = _canonical_json(payload)
        canonical = _canonical_around(
            payload,
            payload_text,
            chain=chain,
            seq=seq,
            kind=spec.kind,
            actor=spec.actor,
            subject=spec.subject,
            created_at=created_at.isoformat(),
        )
        event_hash = chain_hash(prev_hash, canonical)
        # (by position, in the model's column order: Model.__init__'s short way, the
        # instance it makes by keyword)
        event = AuditEvent(
            None,
            chain,
            session_id,
            seq,
            spec.kind,
            spec.actor,
            spec.subject,
            payload,
            created_at,
            prev_hash,
            event_hash,
        )
        # (the payload's text as hashed, for the append's JSONB parameter: with the
        # payload it was made of, so a payload replaced since is encoded again)
        event._payload_text = (payload, payload_text)  # type: ignore[attr-defined]
        yield event
        prev_hash = event_hash


def _locked_head(chain: str) -> AuditChain | None:
    """The chain's head row, locked until commit (None for a chain with no event yet).

    The row lock serializes appends to one chain; a chain's very first append takes an
    advisory lock instead, since there is no row to lock yet.
    """
    head = _HEAD.first(chain)
    if head is None:
        _lock_chain(chain)
        head = _HEAD.first(chain)
    return head


# Read and locked by every append (floor.compiled).
_HEAD = Compiled(lambda chain: AuditChain.objects.select_for_update().filter(chain=chain)[:1])


def write_and_lock_head(
    statement: str,
    params: Sequence[Any],
    *,
    session_id: UUID | str | None,
    prepare: bool | None = True,
) -> tuple[int, AuditChain | None]:
    """Run `statement` (an INSERT or UPDATE without RETURNING) and, when it wrote a row,
    lock the head of the chain its events go to, in one statement on PostgreSQL.

    Returns how many rows the statement wrote and the locked head (None when it wrote
    nothing, or the chain has no head yet: record_events locks it then). Pass the head to
    record_events as `locked_head`. The write comes first, then the lock (the head's scan
    waits for the write: a one-time filter on its row count), in the order a transition
    takes them as two statements, so the fold adds no lock-order inversion. On other
    backends the two stay separate: the statement runs here, record_events locks.
    `prepare` as for floor.compiled.fixed_cursor (None for a statement of many
    texts: an INSERT of N rows).
    """
    if not connection.in_atomic_block:
        raise transaction.TransactionManagementError(
            "write_and_lock_head must run inside transaction.atomic()"
        )
    chain = str(session_id) if session_id else GLOBAL_CHAIN
    with fixed_cursor(prepare=prepare) as cursor:
        if connection.vendor != "postgresql":
            cursor.execute(statement, params)
            return cursor.rowcount, None
        cursor.execute(_gated_head_sql(statement), [*params, chain])
        written, *row = cursor.fetchone()
    if not written or row[0] is None:
        return written, None
    for index, converters in _head_converters(connection.vendor):
        value = row[index]
        if value is not None:
            col = _HEAD_FIELDS[index].get_col(AuditChain._meta.db_table)
            for converter in converters:
                value = converter(value, col, connection)
            row[index] = value
    return written, AuditChain.from_db(connection.alias, _HEAD_NAMES, row)


_HEAD_FIELDS = list(AuditChain._meta.concrete_fields)
_HEAD_NAMES = [f.attname for f in _HEAD_FIELDS]


@functools.cache
def _gated_head_sql(statement: str) -> str:
    quote = connection.ops.quote_name
    columns = ", ".join(quote(str(f.column)) for f in _HEAD_FIELDS)
    table, key = quote(AuditChain._meta.db_table), quote(str(_concrete(AuditChain, "chain").column))
    # Only the caller's statement text and the model's quoted names are in the text; every
    # value is a parameter.
    return (
        f"WITH written AS ({statement} RETURNING 1) "  # noqa: S608
        "SELECT (SELECT count(*) FROM written), head.* FROM (SELECT 1) AS one "
        f"LEFT JOIN LATERAL (SELECT {columns} FROM {table} WHERE {key} = %s "
        "AND (SELECT count(*) FROM written) > 0 FOR UPDATE) AS head ON true"
    )


@functools.cache
def _head_converters(vendor: str) -> list[tuple[int, list[Any]]]:
    """The head's columns that have converters (as the ORM applies them to a read), with
    them: none on PostgreSQL for these column types today, so rows are used as they come."""
    del vendor  # (the cache key: converters depend on the backend)
    out = []
    for index, field in enumerate(_HEAD_FIELDS):
        col = field.get_col(AuditChain._meta.db_table)
        converters = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
        if converters:
            out.append((index, converters))
    return out


def audit_copy(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload as the log keeps it: plain JSON, secrets masked (flagged "masked": true).

    Text pre-masked with audit.masking.premask is kept as it is (and flags the payload
    when masking changed it); everything else is masked here.

    What `_audit_copy_walks` gives, in one walk of the payload for the values every
    event holds (plain str, int, bool, None, float, pre-masked text, dicts of those
    under str keys): that function's four walks (made plain, made storable, masked,
    compared) cost most of an event's Python work (docs/benchmarks.md). Any other value
    (a list, an enum, a key that is not plain text, a secret key's value) is copied by
    those walks, for its part of the payload only.
    """
    if type(payload) is dict:
        copied = _copied_dict(payload)
        if copied is not None:
            masked, changed = copied
            if changed:
                masked["masked"] = True
            return masked
    return _audit_copy_walks(payload)


def _audit_copy_walks(payload: dict[str, Any]) -> dict[str, Any]:
    """audit_copy's definition: made plain, then storable, then masked; flagged when
    masking changed anything or a pre-masked text in it was changed."""
    plain = storable(_plain(payload))
    masked = mask_secrets(plain)
    if masked != plain or contains_masked(plain):
        masked["masked"] = True
    return masked  # type: ignore[no-any-return]


def _copied_dict(value: dict[Any, Any]) -> tuple[dict[str, Any], bool] | None:
    """A dict's audit copy (not flagged) and whether masking changed it (a value, or a
    pre-masked text in it); None when a key is not plain text without NUL (its plain
    form could then meet another key's: the walks decide)."""
    out: dict[str, Any] = {}
    changed = False
    for key, item in value.items():
        if type(key) is not str or "\x00" in key:
            return None
        if is_secret_key(key):
            plain = storable(_plain(item))
            masked = masked_item(key, plain)
            out[key] = masked
            changed = changed or masked != plain or contains_masked(plain)
            continue
        masked, item_changed = _copied(item)
        out[key] = masked
        changed = changed or item_changed
    return out, changed


def _copied(value: Any) -> tuple[Any, bool]:
    """A value's audit copy under a key that names no secret, and whether masking
    changed it (as `_audit_copy_walks` compares and flags it)."""
    kind = type(value)
    if kind is str:
        plain = value.replace("\x00", "\ufffd") if "\x00" in value else value
        if plain in _UNCHANGED_BY_MASKING:
            return plain, False
        masked = mask_text(plain)
        if masked == plain:
            _remember_unchanged(plain)
            return plain, False
        return masked, True
    if kind is Masked:
        return value, value.changed
    if value is None or kind is int or kind is bool:
        return value, False
    if kind is float:
        return storable(value), False
    if kind is dict:
        copied = _copied_dict(value)
        if copied is not None:
            return copied
    elif isinstance(value, str) and not isinstance(value, Masked):  # (a str enum: its text)
        return _copied(str.__str__(value))
    plain = storable(_plain(value))
    masked = mask_secrets(plain)
    return masked, masked != plain or contains_masked(plain)


# Short texts that masking left as they were, as `_copied` last met them (the events'
# constant texts: a decision's reason, kinds, modes, statuses). mask_text is a function of
# its text alone (audit.masking's rules are the module's constants), so a text found here
# would be masked to itself again: the lookup gives what the call would. Only unchanged
# texts are kept, the texts an event stores as they are: the dict holds nothing the log
# does not, and nothing a masking rule found. Bounded: emptied when full.
_UNCHANGED_BY_MASKING: dict[str, None] = {}
_UNCHANGED_MAX_TEXTS = 1024
_UNCHANGED_MAX_CHARS = 256


def _remember_unchanged(text: str) -> None:
    if len(text) > _UNCHANGED_MAX_CHARS:
        return
    if len(_UNCHANGED_BY_MASKING) >= _UNCHANGED_MAX_TEXTS:
        _UNCHANGED_BY_MASKING.clear()
    _UNCHANGED_BY_MASKING[text] = None


def _plain(value: Any) -> Any:
    """`value` as `json.loads(json.dumps(value, default=str))` would give it back, but
    keeping pre-masked text (Masked) as it is."""
    if isinstance(value, Masked):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, dict):
        return {_plain_key(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return str(value)


def _plain_key(key: Any) -> str:
    """A dict key as JSON text writes it (json.dumps's rules: str, bool, None, numbers)."""
    if isinstance(key, str):
        return str.__str__(key)
    if key is None or isinstance(key, bool | int | float):
        return json.dumps(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _write(head: AuditChain | None, events: list[AuditEvent]) -> None:
    """Insert `events` and move the chain's head to the last of them (under the chain lock).

    On PostgreSQL an existing chain's append is one statement (the INSERT and the head's
    UPDATE in one WITH): every transition pays one round trip for its audit record, not two.
    """
    new_head, changed = _advance_head(head, events)
    if changed is not None and connection.vendor == "postgresql":
        _append_in_one_statement(new_head, events, changed)
        return
    AuditEvent.objects.bulk_create(events)
    new_head.last_event_id = events[-1].pk
    if changed is None:
        new_head.save(force_insert=True)
    else:
        new_head.save(update_fields=sorted(changed))


EVENT_COLUMNS = (
    "chain",
    "session_id",
    "seq",
    "kind",
    "actor",
    "subject",
    "payload",
    "created_at",
    "prev_hash",
    "hash",
)
# linked_events passes an event's values by position, in this order after its id.
if tuple(f.attname for f in AuditEvent._meta.concrete_fields) != ("id", *EVENT_COLUMNS):
    raise RuntimeError("AuditEvent's columns changed: update EVENT_COLUMNS and linked_events")


def _concrete(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field)
    return field


def _append_in_one_statement(head: AuditChain, events: list[AuditEvent], changed: set[str]) -> None:
    sql, event_fields, head_fields = _append_sql(
        len(events), tuple(sorted(changed - {"last_event_id"}))
    )
    db = connections[DEFAULT_DB_ALIAS]  # (once: each use of the `connection` proxy is a lookup)
    params: list[Any] = []
    for event in events:
        params += [bind(getattr(event, name), db) for name, bind in event_fields]
        made = getattr(event, "_payload_text", None)
        if made is not None and made[0] is event.payload:
            # The payload's canonical text, made for its hash, as its JSONB parameter: the
            # same jsonb value as the ORM's parameter (json.dumps of the same dict; JSONB
            # keeps neither key order nor spacing), encoded once.
            params[_PAYLOAD_AT - len(event_fields)] = Jsonb(made[1], dumps=_as_is)
    params += [bind(getattr(head, name), db) for name, bind in head_fields]
    params += [events[-1].seq, head.chain]
    # (one text per event count and changed counters: prepared at once for one event, at
    # psycopg's count for more)
    with fixed_cursor(prepare=True if len(events) == 1 else None) as cursor:
        cursor.execute(sql, params)
        inserted = cursor.fetchall()
    ids = {seq: pk for pk, seq, _moved in inserted}
    if len(ids) != len(events) or any(moved != 1 for *_, moved in inserted):
        # Under the chain lock the head exists and every row was inserted: anything else
        # is a broken store, and the transaction must not commit.
        raise DatabaseError("the audit append did not insert its events and move its head")
    for event in events:
        event.pk = ids[event.seq]
    head.last_event_id = events[-1].pk


_PAYLOAD_AT = EVENT_COLUMNS.index("payload")


def _as_is(text: str) -> str:
    return text


@functools.lru_cache(maxsize=256)  # (a shape per event count: bounded all the same)
def _append_sql(
    count: int, head_names: tuple[str, ...]
) -> tuple[str, list[tuple[str, Binder]], list[tuple[str, Binder]]]:
    """The append's statement for `count` events and the head's changed columns
    `head_names`, with the attributes whose values it binds, in order, each with its
    field's binder (floor.compiled.binder; built once per shape: a few per process)."""
    quote = connection.ops.quote_name
    event_fields = [_concrete(AuditEvent, name) for name in EVENT_COLUMNS]
    head_fields = [_concrete(AuditChain, name) for name in head_names]
    row = "(" + ", ".join(["%s"] * len(event_fields)) + ")"
    sets = "".join(f"{quote(str(f.column))} = %s, " for f in head_fields)
    events_table, heads_table = quote(AuditEvent._meta.db_table), quote(AuditChain._meta.db_table)
    columns = ", ".join(quote(str(f.column)) for f in event_fields)
    rows = ", ".join([row] * count)
    # Only the models' quoted table and column names are in the text; every value is a
    # parameter.
    sql = (
        f"WITH new_events AS (INSERT INTO {events_table} ({columns}) VALUES {rows} "  # noqa: S608
        'RETURNING "id", "seq"), '
        f'moved AS (UPDATE {heads_table} SET {sets}"last_event_id" = '
        '(SELECT "id" FROM new_events WHERE "seq" = %s) WHERE "chain" = %s RETURNING 1) '
        'SELECT "id", "seq", (SELECT count(*) FROM moved) FROM new_events'
    )
    return (
        sql,
        [(f.attname, binder(f)) for f in event_fields],
        [(f.attname, binder(f)) for f in head_fields],
    )


def _advance_head(
    head: AuditChain | None, events: list[AuditEvent]
) -> tuple[AuditChain, set[str] | None]:
    """The chain's head moved (in memory) to the last of `events`, with the session summary
    counted, and the columns that changed (None: a new head, every column)."""
    first, last = events[0], events[-1]
    if head is None:
        head = AuditChain(chain=first.chain, session_id=first.session_id, first_at=first.created_at)
        changed: set[str] | None = None  # insert every column
    else:
        changed = {"last_at", "last_seq", "last_hash", "last_event_id", "head_signature"}
    # Calls whose name never resolved to a tool (rejected at receive or resolve, in the
    # same append as their call.received): their names are not listed (_summarize).
    unresolved = {
        event.subject
        for event in events
        if event.kind == kinds.CALL_REJECTED and event.payload.get("stage") in _UNRESOLVED
    }
    for event in events:
        changed = _summarize(head, event, changed, unresolved)
    head.last_at = last.created_at
    head.last_seq = last.seq
    head.last_hash = last.hash
    head.head_signature = sign_head(head.chain, last.seq, last.hash)
    return head, changed


# The stages before a call's name is known to be a tool (dispatcher.admission._decide).
_UNRESOLVED = frozenset({"receive", "resolve"})

# At most this many tool names are listed in a session's summary (the session list's Tools
# column and filter, the session page's tool filter). A coding agent's client may name any
# tool it has (Claude Code's mcp__server__tool, or a tool Harness does not know), and each
# such name resolves: a client making names up grew the list without bound, every name a
# rewrite of the head row. Past the cap the list ends in MORE_TOOLS (no tool is named so),
# and such a session matches every tool filter (audit.views): never left out of one.
TOOLS_LISTED = 100
MORE_TOOLS = "\u2026"


def _summarize(
    head: AuditChain, event: AuditEvent, changed: set[str] | None, unresolved: set[str]
) -> set[str] | None:
    """Count `event` into the session summary; returns the changed columns (None: all)."""
    payload = event.payload
    fields: list[str] = []
    if event.kind == kinds.SESSION_STARTED:
        head.agent = str(payload.get("agent", ""))[:200]
        head.owner = str(payload.get("owner", ""))[:150]
        head.title = str(payload.get("title", ""))[:200]
        head.mode = str(payload.get("mode", ""))[:16]
        fields += ["agent", "owner", "title", "mode"]
    counter = kinds.get(event.kind).counter
    if counter:
        setattr(head, counter, getattr(head, counter) + 1)
        fields.append(counter)
    if event.kind == kinds.CALL_COMPLETED and payload.get("is_error"):
        head.errors += 1
        fields.append("errors")
    tool = payload.get("tool")
    # Only the names of tools Harness knows: a call rejected before its name resolved is
    # kept in the events only, so an agent cannot grow the list with made-up names (and
    # hide a real one among them). One word only: the summary is a list of words, and a
    # made-up name "x run_command y" would list its session under run_command.
    if (
        event.kind == kinds.CALL_RECEIVED
        and event.subject not in unresolved
        and isinstance(tool, str)
        and tool.split() == [tool]
        and f" {tool} " not in head.tools
        and f" {MORE_TOOLS} " not in head.tools
    ):
        listed = len(head.tools.split()) < TOOLS_LISTED
        head.tools = (head.tools or " ") + (tool if listed else MORE_TOOLS) + " "
        fields.append("tools")
    return None if changed is None else changed | set(fields)
