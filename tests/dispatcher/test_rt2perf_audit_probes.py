"""Red-team probes of the audit append's encode-once path and the masking memo
(audit.services `_canonical_around`, `_append_in_one_statement`, `_UNCHANGED_BY_MASKING`):
whatever a payload holds, the hashed text is the one `verify_audit` recomputes from the
stored row, on PostgreSQL and on the embedded SQLite, one event or many in one append;
and the memo never gives a text that masking would change."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import threading
import uuid
from typing import Any

import pytest
from django.db import models, transaction
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_lazy

from audit import services
from audit.masking import mask_text
from audit.models import AuditEvent
from audit.services import EventSpec, audit_copy, record_events
from audit.verify import event_hash, verify_database

SECRET = "ghp_" + "a1B2" * 9


class Level(enum.IntEnum):
    HIGH = 3


class Color(models.TextChoices):
    RED = "red"


class Liar(str):
    """A text that says it equals (and hashes as) a harmless constant."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash("trusted")


DEEP: dict[str, Any] = {}
_node = DEEP
for _ in range(200):
    _node["d"] = {}
    _node = _node["d"]
_node["leaf"] = 1.5

PAYLOADS: dict[str, dict[Any, Any]] = {
    "nan": {"x": float("nan")},
    "inf": {"x": float("inf"), "y": float("-inf")},
    "negative zero": {"x": -0.0, "n": {"x": -0.0}},
    "1e308": {"x": 1e308, "n": {"y": 1.7976931348623157e308}},
    "0.1+0.2": {"x": 0.1 + 0.2},
    "tiny": {"x": 5e-324, "y": 1e-7, "z": 1.0000000000000002e-300},
    "1e16": {"x": 1e16, "y": 1.5e300},
    "big ints": {"x": 10**40, "y": -(2**70), "z": 2**63},
    "bools vs ints": {"t": True, "one": 1, "f": False, "zero": 0},
    "none": {"x": None},
    "int keys": {1: "a", "n": {2: "b"}},
    "keys equal as json": {1: "a", "1": "b", False: "c", "false": "e", None: "d", "null": "f"},
    "float keys": {1.5: "a", -0.0: "b"},
    "unicode": {"nfc": "\u00e9", "nfd": "e\u0301", "rtl": "\u202eabc", "emoji": "\U0001f600"},
    "separators": {"x": "\u2028\u2029\x7f\ufeff\x1f\x85", "\u2028": 1},
    "noncharacters": {"x": "\ufffe\uffff\U0010ffff\ufdd0", "\uffff": "\U0001f600"},
    "nul": {"x": "a\x00b", "k\x00": "v", "n": {"y": "\x00"}},
    "deep": DEEP,
    "tuple": {"x": (1, "a", (2,))},
    "decimal": {"x": decimal.Decimal("1.10"), "y": decimal.Decimal("NaN")},
    "datetime": {"x": dt.datetime(2026, 12, 6, 19, 0, tzinfo=dt.UTC), "d": dt.date(2026, 1, 1)},
    "uuid": {"x": uuid.UUID(int=1)},
    "lazy": {"x": gettext_lazy("Allowed")},
    "int enum": {"x": Level.HIGH, "n": {"y": Level.HIGH}},
    "text choices": {"x": Color.RED, Color.RED: "k"},
    "safe string": {"x": mark_safe("<b>")},
    "liar": {"x": Liar(f"token={SECRET}")},
    "secret text": {"x": f"Authorization: Bearer {SECRET}", "password": "hunter22"},
    "list of args": {"x": ["mysql", "-pSECRETsecret1"]},
}


def _row(event: AuditEvent) -> dict[str, Any]:
    stored = AuditEvent.objects.get(pk=event.pk)
    return {
        "chain": stored.chain,
        "seq": stored.seq,
        "kind": stored.kind,
        "actor": stored.actor,
        "subject": stored.subject,
        "payload": stored.payload,
        "created_at": stored.created_at.astimezone(dt.UTC).isoformat(),
        "prev_hash": stored.prev_hash,
        "hash": stored.hash,
    }


def _append(payloads: list[dict[Any, Any]], session_id: uuid.UUID) -> list[AuditEvent]:
    with transaction.atomic():
        return record_events(
            [EventSpec("call.received", "agent:a", f"call:{i}", p) for i, p in enumerate(payloads)],
            session_id=session_id,
        )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_every_payload_verifies_alone_and_in_a_batch(name: str) -> None:
    session_id = uuid.uuid4()
    payload = PAYLOADS[name]
    _append([{"first": 1}], session_id)  # (then an existing chain: one statement on PG)
    [alone] = _append([payload], session_id)
    batch = _append([payload, {"x": "between"}, payload], session_id)
    for event in [alone, *batch]:
        row = _row(event)
        assert row["payload"] == event.payload
        assert event_hash(row) == row["hash"] == event.hash
        assert SECRET not in str(row["payload"])
    assert verify_database(str(session_id)).ok


@pytest.mark.django_db(transaction=True)
def test_a_lone_surrogate_writes_nothing() -> None:
    session_id = uuid.uuid4()
    _append([{"first": 1}], session_id)
    with pytest.raises((UnicodeError, ValueError)):
        _append([{"x": "\ud800"}], session_id)
    assert AuditEvent.objects.filter(chain=str(session_id)).count() == 1
    assert verify_database(str(session_id)).ok


def test_the_memo_never_gives_a_text_masking_would_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(services, "_UNCHANGED_BY_MASKING", {})
    services.audit_copy({"x": "trusted"})
    copy = audit_copy({"x": Liar(f"token={SECRET}")})
    assert SECRET not in str(copy) and copy["masked"] is True
    # (a text equal as str but of another type: a str enum's text is its own)
    assert audit_copy({"x": Color.RED}) == {"x": "red"}


def test_the_memo_under_threads_gives_masking_s_result_and_stays_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(services, "_UNCHANGED_BY_MASKING", {})
    errors: list[BaseException] = []
    wrong: list[str] = []
    texts = [f"text {i}" for i in range(3000)] + [f"password={SECRET}{i}" for i in range(50)]

    def work(offset: int) -> None:
        try:
            for i in range(len(texts)):
                text = texts[(i * 7 + offset) % len(texts)]
                if audit_copy({"x": text})["x"] != mask_text(text):
                    wrong.append(text)
        except BaseException as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and wrong == []
    assert len(services._UNCHANGED_BY_MASKING) <= services._UNCHANGED_MAX_TEXTS + len(threads)
    assert not any(SECRET in text for text in services._UNCHANGED_BY_MASKING)
