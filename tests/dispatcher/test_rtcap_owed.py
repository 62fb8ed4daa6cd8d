"""rtcap (issue 37): every place a worker gave back (batches.end_turn) built an owed turn's
Celery message (two uuid4, two json.dumps, a base64) in case a turn was owed, though
almost none is: about 0.19 ms of the worker's path per call run. Now the message is made
by the give-back's script, only when a turn is owed, from a template the process builds
once (celery_message.task_message_template), with ids of its own for each message."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest

from dispatcher import batches
from floor import celery_message
from floor.redis_clients import one_round_trip


def take(broker: Any, queue: str) -> batches.Turn:
    assert broker.rpop(queue) is not None, "no message left for a turn"
    return batches.take_turn("message")


def counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The owed turns' messages built in Python from here on (their call ids)."""
    built: list[str] = []
    real = celery_message.task_message

    def task_message(task: str, call_id: str, queue: str, *more: str) -> str:
        built.append(call_id)
        return real(task, call_id, queue, *more)

    monkeypatch.setattr(celery_message, "task_message", task_message)
    return built


def owed_messages(queue: tuple[Any, str], pipelined: bool) -> list[dict[str, Any]]:
    """Three calls of one person, four messages: two turns owed, sent as two places are
    given back (the second give-back owes nothing more). The owed turns' messages."""
    broker, name = queue
    owner = batches.Share("1", str(uuid.uuid4()))
    for call in ("a1", "a2", "a3"):
        batches.enqueue(call, owner)
    batches.enqueue("a3", owner, resend=True)  # (a fourth message: a re-send)
    first = take(broker, name)
    assert first.call_id == "a1"
    assert take(broker, name) == batches.Turn("") == take(broker, name)  # two owed
    messages = []
    for turn in (first, None):
        if turn is None:
            assert broker.llen(name) == 2  # the owed turn's, and the re-send's
            turn = take(broker, name)
            assert turn.call_id == "a2"
        if pipelined:
            with one_round_trip(turn.url):
                batches.end_turn(turn)
        else:
            batches.end_turn(turn)
        messages.append(json.loads(broker.lindex(name, 0)))
    assert broker.get(batches._owed_key(name)) in (None, b"0")
    return messages


@pytest.mark.parametrize("pipelined", [False, True])
def test_an_owed_turns_message_is_celerys_with_ids_of_its_own(
    cap_queue: tuple[Any, str], pipelined: bool
) -> None:
    _, name = cap_queue
    sent = owed_messages(cap_queue, pipelined)
    expected = json.loads(
        celery_message.task_message(batches.EXECUTE_TASK, batches.OWED_TURN, name)
    )
    ids = set()
    for message in sent:
        task_id = message["headers"]["id"]
        assert re.fullmatch(
            r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", task_id
        )
        assert message["properties"]["correlation_id"] == message["headers"]["root_id"] == task_id
        ids |= {task_id, message["properties"]["delivery_tag"]}
        for part, keys in (
            ("headers", ("id", "root_id")),
            ("properties", ("correlation_id", "delivery_tag")),
        ):
            for key in keys:
                message[part].pop(key)
                expected[part].pop(key, None)
        assert message == expected
    assert len(ids) == 4, ids  # each message's id and delivery tag its own


def test_a_place_given_back_with_no_turn_owed_builds_no_message(
    cap_queue: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, name = cap_queue
    owner = batches.Share("1", str(uuid.uuid4()))
    batches.enqueue("a1", owner)
    turn = take(broker, name)
    built = counting(monkeypatch)
    with one_round_trip(turn.url):
        batches.end_turn(turn)
    # Before: one owed turn's message built for every place given back.
    assert built == []
    assert broker.llen(name) == 0 and not broker.exists(batches._running_key(name, "1"))
