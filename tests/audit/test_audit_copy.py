"""The audit copy of a payload made in one walk (audit.services.audit_copy) is exactly what
its definition's four walks make (`_audit_copy_walks`: made plain, storable, masked, then
flagged): the same values, of the same types, the same flag, the same hashed text, for
payloads of every shape an event may carry (secrets in values and under secret keys,
pre-masked text changed or not, NUL characters, floats PostgreSQL rewrites, enums, keys
that are not text, lists read as commands)."""

from __future__ import annotations

import enum
import json
import math
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from audit.masking import Masked, premask
from audit.services import _audit_copy_walks, audit_copy, canonical_event


class Colour(enum.StrEnum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


SECRET = "ghp_" + "a1B2" * 9

texts = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        [
            "",
            "a\x00b",
            "plain words",
            f"Bearer {SECRET}",
            f"--password {SECRET}",
            f"curl -u alice:{SECRET} https://x",
            f"AWS_SECRET_ACCESS_KEY={SECRET}",
            f'{{"token": "{SECRET}"}}',
            "mysql",
            "-pHunter2x",
            "--password",
            "hunter2-Secret9",
            "[masked:token#abcd1234]",
        ]
    ),
)
keys = st.one_of(
    texts,
    st.sampled_from(["password", "api_key", "Authorization", "token", "max_tokens", "a\x00b"]),
)
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e20, -0.0, 0.0, 1.5, float("nan"), Colour.RED, Level.HIGH]),
    texts,
    texts.map(premask),
)
any_key = st.one_of(keys, st.integers(), st.none(), st.booleans(), st.sampled_from([1.5, 1.0]))
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(texts, min_size=2, max_size=4),  # (an argument list, read as one command)
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(keys, inner, max_size=4),
        st.dictionaries(any_key, inner, max_size=3),
    ),
    max_leaves=12,
)
payloads = st.one_of(
    st.dictionaries(keys, values, max_size=6), st.dictionaries(any_key, values, max_size=4)
)


def shape(value: Any) -> Any:
    """The value with every type named (1 and True and 1.0 apart, Masked and its flag)."""
    if isinstance(value, dict):
        return ("dict", [(shape(k), shape(v)) for k, v in value.items()])
    if isinstance(value, list | tuple):
        return (type(value).__name__, [shape(v) for v in value])
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    if isinstance(value, Masked):
        return ("Masked", str(value), value.changed)
    return (type(value).__name__, value)


@settings(max_examples=1500, deadline=None)
@given(payloads)
@example({"call_id": "c", "arguments": premask(f'{{"password": "{SECRET}"}}'), "n": 1})
@example({"argv": ["mysql", "-pHunter2x"], "note": f"Bearer {SECRET}"})
@example({1: "a", "1": "b"})
@example({"a\x00": 1, "a\ufffd": 2})
@example({"from": Colour.RED, "level": Level.HIGH, "seconds": 0.0012, "big": 1e20})
@example({"provenance": {"mode": "trusted", "layers": {"org": 3}}, "token": None})
def test_the_one_walk_copy_is_the_four_walks_copy(payload: dict[Any, Any]) -> None:
    expected = _audit_copy_walks(payload)
    got = audit_copy(payload)
    assert shape(got) == shape(expected)
    assert hashed_text(got) == hashed_text(expected)


def hashed_text(payload: dict[str, Any]) -> str:
    return canonical_event(
        chain="c", seq=1, kind="k", actor="a", subject="s", payload=payload, created_at="t"
    )


def test_a_secret_in_a_value_is_masked_and_flagged_and_plain_values_are_kept() -> None:
    payload = {"note": f"Bearer {SECRET}", "n": 2, "ok": True, "none": None}
    copied = audit_copy(payload)
    assert SECRET not in json.dumps(copied)
    assert copied["masked"] is True and copied["n"] == 2 and copied["ok"] is True
    assert audit_copy({"note": "hello"}) == {"note": "hello"}  # nothing masked: no flag
    changed = premask(f"--password {SECRET}")
    assert changed.changed and audit_copy({"arguments": changed})["masked"] is True
