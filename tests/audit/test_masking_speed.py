"""Masking takes time linear in its input: the inputs that made the old patterns backtrack
(8 KB of token-token held the GIL for minutes) are masked in well under a second."""

from __future__ import annotations

import json
import random
import re
import time
from typing import Any

import pytest
from django.db import connection

from audit import masking
from audit.masking import mask_text
from audit.models import AuditEvent
from dispatcher import agents
from tests.support.factories import make_agent, submit_one

# Pieces of what each pattern looks for, repeated or mixed: where a backtracking pattern
# would try again and again from every position.
FRAGMENTS = [
    "token-",
    "token",
    "password",
    "password=",
    '"password": "',
    '"a":"',
    "Bearer ",
    "bearer aaaaaaa",
    "-----BEGIN PRIVATE KEY-----",
    "-----",
    "--password ",
    "--pass ",
    "-p",
    "mysql -p",
    "curl -u a:",
    "sshpass -p",
    "a://b:",
    "http://u:p",
    "sk-",
    "hrn_00000000_",
    "ghp_",
    "xoxb-",
    "AKIA",
    "eyJaaaaaaaaaaa.",
    "=",
    ":",
    "-",
    " ",
    "\\",
    '"',
    "'",
    '\\"',
    'x="',
    'PASSWORD=\\"a',
    "token=abcd ",
    "a" * 127 + "=",
    '"' + "a" * 127,
    "token" * 26 + " ",
    '"password": [',  # a list under a secret key in JSON text
    "1e-",
    '"a", ',
    '\\"password\\": \\"',  # JSON text in a JSON string
    "\\\\",
    "Cookie: ",
    "a=b;",
]


def inputs(size: int, mixes: int, seed: int = 1) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    cases = [(repr(f), (f * (size // len(f) + 1))[:size]) for f in FRAGMENTS]
    for _ in range(mixes):
        a, b = rng.sample(FRAGMENTS, 2)
        cases.append((repr(a + b), ((a + b) * (size // len(a + b) + 1))[:size]))
        parts, length = [], 0
        while length < size:
            parts.append(rng.choice(FRAGMENTS))
            length += len(parts[-1])
        cases.append(("mix", "".join(parts)[:size]))
    return cases


def seconds(text: str) -> float:
    # (this thread's CPU time, not the wall clock's: a loaded host's other work is not in it)
    began = time.thread_time()
    mask_text(text)
    return time.thread_time() - began


def test_8kb_of_token_token_is_masked_at_once() -> None:
    text = ("token-" * 1366)[:8192]
    assert seconds(text) < 0.2  # was about 90 s (cubic backtracking)
    assert seconds(json.dumps({"a": text})) < 0.2


@pytest.mark.heavy
def test_no_input_of_256kb_takes_long() -> None:
    """Against a plain text of the same size masked in the same run, both in this thread's
    CPU time (a loaded host's other processes count in neither): about 15-20x it, where
    a pattern that backtracks takes minutes (the test of 8 KB above: 90 s)."""
    size = 256 * 1024
    plain = ("lorem ipsum dolor sit amet consectetur " * (size // 39 + 1))[:size]
    base = min(seconds(plain) for _ in range(3))
    slowest = max((seconds(text), name) for name, text in inputs(size, mixes=10))
    assert slowest[0] < max(60 * base, 0.5), (slowest, base)


@pytest.mark.slow
def test_no_input_of_1mb_takes_long() -> None:
    size = 1024 * 1024  # (as the test of 256 KB)
    plain = ("lorem ipsum dolor sit amet consectetur " * (size // 39 + 1))[:size]
    base = min(seconds(plain) for _ in range(3))
    slowest = max((seconds(text), name) for name, text in inputs(size, mixes=40))
    assert slowest[0] < max(60 * base, 2), (slowest, base)


@pytest.mark.django_db(transaction=True)
def test_admission_masks_the_arguments_before_its_transaction_opens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dispatcher import admission  # noqa: PLC0415

    inside: list[bool] = []

    def premask_arguments(text: str, arguments: dict[str, Any] | None) -> masking.Masked:
        inside.append(connection.in_atomic_block)
        return masking.premask_arguments(text, arguments)

    monkeypatch.setattr(admission, "premask_arguments", premask_arguments)
    session = agents.start_session(agent=make_agent(mode="locked").agent)
    call = submit_one(session, "no_such_tool", {"a": "PASSWORD=hunter2-secret"})
    assert inside == [False]
    received = AuditEvent.objects.get(subject=f"call:{call.pk}", kind="call.received")
    assert re.fullmatch(
        r'\{"a":"PASSWORD=\[masked:password#[0-9a-f]{8}\]"\}', received.payload["arguments"]
    )
    assert received.payload["masked"] is True
    assert "hunter2" in call.raw_arguments  # the call itself keeps its exact bytes
