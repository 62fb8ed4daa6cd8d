"""Recompute hash chains and name the first bad event of each chain.

Works on the database or on a JSON Lines export (one event per line, as written by
audit.export). docs/audit.md has a dependency-free version of the same check. On the
database each chain's head must also carry a valid signature (audit.signing); against a
checkpoint file (audit.checkpoints) every checkpointed event must still be there, with the
hash the checkpoint recorded.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.db import connections
from django.db.models import TextField
from django.db.models.functions import Cast

from . import assertions, signing
from .checkpoints import Checkpoint
from .models import AuditChain, AuditEvent
from .services import GENESIS_HASH, canonical_event, chain_hash

EVENT_FIELDS = (
    "id",
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


@dataclass(frozen=True)
class Head:
    seq: int
    hash: str
    signature: str | None = None  # None: not known (an export carries no heads)


@dataclass(frozen=True)
class Problem:
    chain: str
    seq: int | None
    event_id: Any
    what: str

    def __str__(self) -> str:
        where = f"seq {self.seq}" if self.seq is not None else "end of chain"
        ident = f" (event id {self.event_id})" if self.event_id is not None else ""
        return f"chain {self.chain} {where}{ident}: {self.what}"


@dataclass
class _ChainState:
    expected_seq: int = 1
    prev_hash: str = GENESIS_HASH
    failed: bool = False


@dataclass
class Report:
    chains: int = 0
    events: int = 0
    problems: list[Problem] = field(default_factory=list)
    heads: dict[str, Head] = field(default_factory=dict)
    checkpoints: int = 0
    # The key id named by signatures that were made with another key, when every
    # signature checked was and nothing else is wrong (the wrong key is configured, not a
    # forgery everywhere).
    wrong_key: str = ""
    # Verdicts signed with a passkey (step-up) whose assertion was checked.
    assertions: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def event_hash(event: dict[str, Any], seq: int | None = None) -> str:
    canonical = canonical_event(
        chain=event["chain"],
        seq=event["seq"] if seq is None else seq,
        kind=event["kind"],
        actor=event["actor"],
        subject=event["subject"],
        payload=event["payload"],
        created_at=event["created_at"],
    )
    return chain_hash(event["prev_hash"], canonical)


def _written_as_seq(event: dict[str, Any], limit: int) -> int | None:
    """The seq this event's hash was computed with, if it moved (a reordering)."""
    for seq in range(1, limit + 1):
        if seq != event["seq"] and event_hash(event, seq) == event["hash"]:
            return seq
    return None


def _session_matches(event: dict[str, Any]) -> bool:
    """session_id is stored (and exported) beside the chain but not hashed: it must name
    the chain's session, or be empty on a chain that is not a session's (the global one)."""
    if "session_id" not in event:
        return True  # a record without the column (the docs' recipe format)
    session_id, chain = event["session_id"], event["chain"]
    if session_id in (None, ""):
        try:
            uuid.UUID(chain)
        except ValueError:
            return True
        return False
    return bool(str(session_id) == chain)


def _check(event: dict[str, Any], state: _ChainState) -> str | None:
    seq = event["seq"]
    if seq > state.expected_seq:
        missing = f"seq {state.expected_seq}" + (
            f" to {seq - 1}" if seq - 1 > state.expected_seq else ""
        )
        return f"missing {missing}: the event(s) before this one were deleted"
    if seq < state.expected_seq:
        return f"seq {seq} appears again or out of order (expected seq {state.expected_seq})"
    if event_hash(event) != event["hash"]:
        moved = _written_as_seq(event, max(2 * seq, 1000))
        if moved is not None:
            return f"reordered: this event was written as seq {moved}, now it is seq {seq}"
        return "hash mismatch: the stored fields do not produce the stored hash (edited)"
    if not _session_matches(event):
        return "session_id does not name this chain's session: the event was edited"
    if event["prev_hash"] != state.prev_hash:
        return (
            "prev_hash does not match the hash of the event before it: an event was "
            "inserted, removed or replaced here"
        )
    return None


def verify_events(
    events: Iterable[dict[str, Any]],
    heads: dict[str, Head] | None = None,
    checkpoints: Iterable[Checkpoint] = (),
    keys: dict[bytes, assertions.Registered] | None = None,
    *,
    every_chain_headed: bool = False,
) -> Report:
    """Check `events` (each chain in seq order; chains may interleave) against `heads`
    and `checkpoints`.

    Reports the first bad event of each chain. A head (the last seq and hash recorded
    when the chain was written) also catches events removed from, or added to, the end;
    its signature, a head recomputed without the key. A checkpoint catches a chain
    rewritten or cut short since it was taken, heads and signatures included.
    `every_chain_headed` (the database: every append writes its chain's head): a chain
    with events and no head is a problem, since deleting the head with the chain's last
    events would otherwise pass.

    Every verdict signed with a passkey (a payload's "step_up_signature") is checked on its own,
    whatever the chain: its assertion must verify over the challenge recomputed from the
    event, against the passkey registered under its credential id (`keys`; the key the
    event recorded when it is not registered, or for an export read alone). This holds
    even against someone holding the audit key.
    """
    report = Report(heads=dict(heads or {}))
    signers: list[str] = []  # per signature checked: the other key it names, or ""
    _check_head_signatures(report, signers)
    wanted = _checkpoints_by_chain(checkpoints, report, signers)
    seen: dict[tuple[str, int], str] = {}
    last_seq: dict[str, int] = {}
    states: dict[str, _ChainState] = {}
    for event in events:
        report.events += 1
        chain = event["chain"]
        signed = _signed_verdict_problem(event, keys)
        if signed is not None:
            report.assertions += 1
            if signed:
                report.problems.append(Problem(chain, event["seq"], event.get("id"), signed))
        if chain in wanted:
            seen[(chain, event["seq"])] = event["hash"]
            last_seq[chain] = max(last_seq.get(chain, 0), event["seq"])
        state = states.setdefault(chain, _ChainState())
        if state.failed:
            continue
        head = report.heads.get(chain)
        if head is not None and event["seq"] > head.seq:
            what: str | None = f"inserted: the chain's recorded head is seq {head.seq}"
        else:
            what = _check(event, state)
        if what is not None:
            report.problems.append(Problem(chain, event["seq"], event.get("id"), what))
            state.failed = True
            continue
        state.expected_seq = event["seq"] + 1
        state.prev_hash = event["hash"]
    report.chains = len(states)
    _compare_heads(report, states, every_chain_headed)
    _compare_checkpoints(report, wanted, seen, last_seq)
    refused = sum(1 for signer in signers if signer)  # (each is one problem of the report)
    if signers and len(set(signers)) == 1 and signers[0] and len(report.problems) == refused:
        # Every signature names one other key, and nothing else is wrong. Anything else
        # found (an edited event) is listed, whatever key the heads name: a database
        # user can write any key id on a head.
        report.wrong_key = signers[0]
    return report


# The verdict each event kind that can carry a step-up record stands for.
SIGNED_KINDS = {"call.approved": "approve", "approval.vote": "approve", "call.denied": "deny"}


def _signed_verdict_problem(
    event: dict[str, Any], keys: dict[bytes, assertions.Registered] | None
) -> str | None:
    """None: no step-up record here; "": one that proves its verdict; else the problem.
    The record must name this event's call, digest and verdict (an assertion moved here
    from another event is named), and its assertion must verify."""
    payload = event.get("payload")
    if not isinstance(payload, dict) or "step_up_signature" not in payload:
        return None
    stored = payload["step_up_signature"]
    what = assertions.problem_in(stored, keys)
    if what is None:
        expected = (
            event.get("subject"),
            payload.get("digest_seen"),
            SIGNED_KINDS.get(event.get("kind", "")),
        )
        recorded = (f"call:{stored.get('call_id')}", stored.get("digest"), stored.get("verdict"))
        if recorded != expected:
            what = "the signed assertion is for another call, digest or verdict than this event"
    return f"step-up signature: {what}" if what else ""


def _compare_heads(
    report: Report, states: dict[str, _ChainState], every_chain_headed: bool
) -> None:
    """A problem for each recorded head whose chain has no events, or whose chain (read
    without a problem) ends elsewhere than the head says; with `every_chain_headed`, for
    each chain (read without a problem) that has no head."""
    if every_chain_headed:
        for chain, read in states.items():
            if chain not in report.heads and not read.failed:
                report.problems.append(
                    Problem(
                        chain,
                        None,
                        None,
                        f"events exist up to seq {read.expected_seq - 1} but the chain has "
                        "no head (its head was deleted: events at the end may have been "
                        "deleted with it)",
                    )
                )
    for chain, head in report.heads.items():
        state = states.get(chain)
        if state is None:
            report.problems.append(
                Problem(chain, None, None, f"the head records seq {head.seq} but no events exist")
            )
            continue
        last = state.expected_seq - 1
        if not state.failed and (last, state.prev_hash) != (head.seq, head.hash):
            report.problems.append(
                Problem(
                    chain,
                    last + 1,
                    None,
                    f"missing: the chain ends at seq {last} but its recorded head is seq "
                    f"{head.seq} (events at the end were deleted or replaced)",
                )
            )


def _check_head_signatures(report: Report, signers: list[str]) -> None:
    """A problem for each head whose signature does not verify (heads from the database)."""
    for chain, head in sorted(report.heads.items()):
        if head.signature is None:
            continue
        mismatch = signing.check(head.signature, "head", chain, head.seq, head.hash)
        signers.append(mismatch.other_key if mismatch is not None else "")
        if mismatch is not None:
            report.problems.append(
                Problem(
                    chain,
                    None,
                    None,
                    f"the head (seq {head.seq}) is {mismatch}: the head was rewritten by "
                    "someone without the audit key, or is checked with the wrong key",
                )
            )


def _checkpoints_by_chain(
    checkpoints: Iterable[Checkpoint], report: Report, signers: list[str]
) -> dict[str, list[Checkpoint]]:
    """The checkpoints whose signatures verify, by chain (a problem for each that does not)."""
    wanted: dict[str, list[Checkpoint]] = {}
    for checkpoint in checkpoints:
        report.checkpoints += 1
        mismatch = checkpoint.mismatch()
        signers.append(mismatch.other_key if mismatch is not None else "")
        if mismatch is not None:
            report.problems.append(
                Problem(
                    checkpoint.chain,
                    checkpoint.seq,
                    None,
                    f"the checkpoint of {checkpoint.time} is {mismatch}: the checkpoint file "
                    "was edited, or is checked with the wrong key",
                )
            )
            continue
        wanted.setdefault(checkpoint.chain, []).append(checkpoint)
    return wanted


def _compare_checkpoints(
    report: Report,
    wanted: dict[str, list[Checkpoint]],
    seen: dict[tuple[str, int], str],
    last_seq: dict[str, int],
) -> None:
    """One problem per chain: its first checkpoint the log no longer agrees with."""
    for chain, checkpoints in sorted(wanted.items()):
        for checkpoint in sorted(checkpoints, key=lambda c: (c.seq, c.time)):
            found = seen.get((chain, checkpoint.seq))
            if found == checkpoint.hash:
                continue
            if chain not in last_seq:
                what = "no events exist"
            elif found is None:
                what = (
                    f"the chain ends at seq {last_seq[chain]} (truncated since the checkpoint, "
                    "or the events were renumbered)"
                )
            else:
                what = (
                    "the event there has another hash now (the chain was rewritten since "
                    "the checkpoint, hashes recomputed)"
                )
            report.problems.append(
                Problem(
                    chain,
                    checkpoint.seq,
                    None,
                    f"the checkpoint of {checkpoint.time} recorded seq {checkpoint.seq} with "
                    f"hash {checkpoint.hash[:16]}..., but {what}",
                )
            )
            break


def database_events(chain: str | None = None) -> Iterator[dict[str, Any]]:
    rows = AuditEvent.objects.order_by("chain", "seq")
    if chain is not None:
        rows = rows.filter(chain=chain)
    fields: tuple[str, ...] = EVENT_FIELDS
    if connections[rows.db].vendor == "sqlite":
        # SQLite keeps times as text, which anyone with the file can change: read the text
        # itself, so that a value Django could not convert is reported, not raised.
        rows = rows.annotate(created_text=Cast("created_at", TextField()))
        fields = tuple("created_text" if f == "created_at" else f for f in EVENT_FIELDS)
    for values in rows.values_list(*fields).iterator(chunk_size=2000):
        event = dict(zip(EVENT_FIELDS, values, strict=True))
        event["created_at"] = _iso_time(event["created_at"])
        yield event


def _iso_time(value: Any) -> str:
    """The hashed text of a stored time (isoformat of the UTC time); an unreadable stored
    value gives a text no hash matches, so the verifier names that event. SQLite's text
    holds no offset; one written into it is read as Django reads it (it moves the time)."""
    if isinstance(value, datetime):
        return value.isoformat()
    try:
        stored = datetime.fromisoformat(str(value))
    except ValueError:
        return f"unreadable time {value!r}"
    return (stored if stored.tzinfo else stored.replace(tzinfo=UTC)).astimezone(UTC).isoformat()


def database_heads(chain: str | None = None) -> dict[str, Head]:
    rows = AuditChain.objects.all()
    if chain is not None:
        rows = rows.filter(chain=chain)
    values = rows.values_list("chain", "last_seq", "last_hash", "head_signature")
    return {c: Head(s, h, sig) for c, s, h, sig in values}


def verify_database(chain: str | None = None, against: Iterable[Checkpoint] = ()) -> Report:
    """Every chain (or one) in the database, its signed head, and `against` checkpoints.

    Raises signing.AuditKeyError when the audit key cannot be read.
    """
    signing.audit_key()
    return verify_events(
        database_events(chain),
        database_heads(chain),
        _only(against, chain),
        assertions.registered_keys(),
        every_chain_headed=True,
    )


def _only(checkpoints: Iterable[Checkpoint], chain: str | None) -> Iterable[Checkpoint]:
    return checkpoints if chain is None else (c for c in checkpoints if c.chain == chain)


# The fields an exported event must have, as what JSON type (`id` and `session_id` are
# optional: the docs' recipe format has neither).
TEXT_FIELDS = ("chain", "kind", "actor", "subject", "created_at", "prev_hash", "hash")


def file_events(path: Path) -> Iterator[dict[str, Any]]:
    """The events of a JSON Lines export, in order. Raises ValueError naming the first line
    that is not JSON, or not an event (a file someone hands over may hold anything)."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    event = json.loads(line)
                except (json.JSONDecodeError, RecursionError) as error:  # (nested too deep)
                    raise ValueError(f"{path}:{number} is not a JSON line: {error}") from error
                if (what := _not_an_event(event)) is not None:
                    raise ValueError(f"{path}:{number} is not an audit event: {what}")
                yield event


def _not_an_event(event: Any) -> str | None:
    """Why `event` (parsed JSON) is not an exported event, or None."""
    if not isinstance(event, dict):
        return f"a JSON {type(event).__name__}, not an object"
    missing = [name for name in (*TEXT_FIELDS, "seq", "payload") if name not in event]
    if missing:
        return f"no {', '.join(missing)}"
    wrong = [name for name in TEXT_FIELDS if not isinstance(event[name], str)]
    if wrong:
        return f"{', '.join(wrong)} not text"
    if type(event["seq"]) is not int or event["seq"] < 1:
        return "seq is not a positive whole number"
    return None


def verify_file(path: Path, chain: str | None = None, against: Iterable[Checkpoint] = ()) -> Report:
    """A JSON Lines export, against `against` checkpoints (an export carries no heads)."""
    events = file_events(path)
    if chain is not None:
        events = (e for e in events if e["chain"] == chain)
    return verify_events(
        events, checkpoints=_only(against, chain), keys=assertions.registered_keys()
    )
