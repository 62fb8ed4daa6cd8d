"""The audit copy's memo of texts masking left unchanged (audit.services
`_UNCHANGED_BY_MASKING`): a constant text every allowed call's events carry (the trusted
mode's reason, about 50 us of masking rules a call) is masked once per process, and the
copy is what masking gives, every time; a text a rule changes is masked every time and
never kept, so the memo holds nothing the log does not store as it is."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from audit import services
from audit.masking import mask_text

SECRET = "ghp_" + "a1B2" * 9
REASON = "The session is in trusted mode: tools run unless a rule or guard stops them."


@pytest.fixture
def masked_texts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The texts audit_copy hands to the masking rules, from an empty memo."""
    seen: list[str] = []

    def counting(text: str) -> str:
        seen.append(text)
        return mask_text(text)

    monkeypatch.setattr(services, "mask_text", counting)
    monkeypatch.setattr(services, "_UNCHANGED_BY_MASKING", {})
    yield seen


def copies(payload: dict[str, Any], n: int = 3) -> list[dict[str, Any]]:
    return [services.audit_copy(payload) for _ in range(n)]


def test_a_text_masking_leaves_as_it_is_is_masked_once_and_copied_the_same(
    masked_texts: list[str],
) -> None:
    payload = {"reason": REASON, "mode": "trusted", "nested": {"reason": REASON}}
    first, *again = copies(payload)
    assert first == {"reason": REASON, "mode": "trusted", "nested": {"reason": REASON}}
    assert all(copy == first for copy in again)
    assert "masked" not in first
    # (the rules ran on each text once; before the memo, once per copy)
    assert masked_texts.count(REASON) == 1 and masked_texts.count("trusted") == 1


def test_a_text_a_rule_changes_is_masked_every_time_and_never_kept(
    masked_texts: list[str],
) -> None:
    text = f"Authorization: Bearer {SECRET}"
    for copy in copies({"note": text}):
        assert SECRET not in copy["note"] and copy["note"] == mask_text(text)
        assert copy["masked"] is True
    assert masked_texts.count(text) == 3
    assert text not in services._UNCHANGED_BY_MASKING
    assert not any(SECRET in kept for kept in services._UNCHANGED_BY_MASKING)


def test_a_secret_keys_value_is_masked_every_time(masked_texts: list[str]) -> None:
    for copy in copies({"password": "hunter22"}):
        assert "hunter22" not in str(copy) and copy["masked"] is True
    assert "hunter22" not in services._UNCHANGED_BY_MASKING


def test_the_memo_is_bounded_in_texts_and_in_their_length(masked_texts: list[str]) -> None:
    long = "x" * (services._UNCHANGED_MAX_CHARS + 1)
    copies({"text": long}, 2)
    assert masked_texts.count(long) == 2 and long not in services._UNCHANGED_BY_MASKING
    for i in range(services._UNCHANGED_MAX_TEXTS + 10):
        services.audit_copy({"text": f"t{i}"})
    assert 0 < len(services._UNCHANGED_BY_MASKING) <= services._UNCHANGED_MAX_TEXTS
    # (emptied when full: still right after it)
    assert copies({"reason": REASON}, 2) == [{"reason": REASON}] * 2
