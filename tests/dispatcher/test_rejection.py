"""Stages 2 and 3 reject with what the model reads (dispatcher.policy.stages.Rejection)."""

from __future__ import annotations

import pickle

import pytest

from dispatcher.policy.stages import Rejection, resolve, validate

pytestmark = pytest.mark.backend_independent


def test_a_rejection_by_validate_names_its_stage_and_every_error() -> None:
    with pytest.raises(Rejection) as caught:
        validate(resolve("list_directory"), {"path": 5, "extra": True})
    rejection = caught.value
    assert rejection.stage == "validate"
    assert rejection.message == (
        "Invalid arguments for 'list_directory':\n"
        "- $: Additional properties are not allowed ('extra' was unexpected); remove it\n"
        "- $.path: expected string, got int 5\n"
        "Fix these arguments and call the tool again."
    )
    # A log line or a re-raise shows the model's text, not a tuple.
    assert str(rejection) == rejection.message


def test_a_rejection_and_its_copy_keep_stage_and_message() -> None:
    rejection = Rejection("resolve", "Tool 'x' does not exist. Available tools: y.")
    assert (rejection.stage, rejection.message) == (
        "resolve",
        "Tool 'x' does not exist. Available tools: y.",
    )
    copy = pickle.loads(pickle.dumps(rejection))  # noqa: S301 (our own object)
    assert (copy.stage, copy.message, str(copy)) == (
        rejection.stage,
        rejection.message,
        rejection.message,
    )
