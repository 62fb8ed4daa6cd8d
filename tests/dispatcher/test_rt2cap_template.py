"""rt2cap: an owed turn's message is made by the give-back's Redis script from a template
(celery_message.task_message_template) whose marks the script replaces with text (Lua's
gsub). Could a queue name or a sender's lineage holding JSON's or Lua's special
characters (a quote, a backslash, a percent sign, a mark's own name) make a message that
is not JSON, or not the one Celery would send? Read back by kombu's own Redis transport."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Connection

from dispatcher import batches
from floor import celery_message
from floor.redis_clients import redis_at
from tests.support.running_cap import mark_counted

AWKWARD = 'q"uo\\te%1%%é\u2028'


@pytest.fixture
def lane(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[tuple[str, str]]:
    target = celery_message.raw_target(batches.EXECUTE_TASK)
    assert target is not None, "the test settings' broker is plain Redis"
    url, name = target[0], f"rt2cap-{uuid.uuid4()}-{AWKWARD}"
    monkeypatch.setattr(celery_message, "raw_target", lambda task: (url, name))
    settings.HARNESS_MAX_RUNNING_PER_OWNER = "1"
    mark_counted(redis_at(url), name)  # (a queue of its own: nothing runs yet)
    yield url, name
    broker = redis_at(url)
    leftover = list(broker.scan_iter(f"rt2cap-{name[7:43]}*"))
    if leftover:
        broker.delete(*leftover)


def owed_message(url: str, queue: str, lineage: tuple[str, str]) -> tuple[str, bytes]:
    """One owner, two calls, a second message owed, and the first place given back with
    `lineage` (the JSON of the sender's root and parent ids): the token and the message."""
    broker = redis_at(url)
    owner = batches.Share("1", str(uuid.uuid4()))
    batches.enqueue("a1", owner)
    batches.enqueue("a2", owner)
    assert broker.rpop(queue) is not None
    turn = batches.take_turn("message")
    assert turn.call_id == "a1"
    assert broker.rpop(queue) is not None
    assert batches.take_turn("message") == batches.Turn("")  # owed
    kinds, parts = celery_message.task_message_template(
        batches.EXECUTE_TASK, batches.OWED_TURN, queue
    )
    keys = [turn.running, batches._owed_key(queue), queue, batches._fair_keys(queue)[0]]
    args = [turn.slot, kinds, *lineage, "", *parts]
    batches._script(url, batches._RELEASE)(keys=keys, args=args)
    assert broker.llen(queue) == 1
    return turn.slot, broker.lindex(queue, 0)


def as_uuid(hex_: str) -> str:
    return str(uuid.UUID(hex_))


@pytest.mark.parametrize(
    "root,parent",
    [
        ('"%1 %% \\"HARNESSMARKPARENT\\" \\\\"', '"p%2"'),
        ("", "null"),
    ],
)
def test_an_owed_turns_message_is_exactly_celerys_whatever_its_queue_and_lineage(
    lane: tuple[str, str], root: str, parent: str
) -> None:
    url, queue = lane
    token, raw = owed_message(url, queue, (root, parent))
    message = json.loads(raw)
    task_id = as_uuid(token)
    tag = as_uuid(token[16:] + token[:16])
    root_id = json.loads(root) if root else task_id
    expected = json.loads(
        celery_message._envelope(
            batches.EXECUTE_TASK,
            (batches.OWED_TURN,),
            queue,
            task_id,
            root_id,
            json.loads(parent),
            tag,
        )
    )
    assert message == expected
    assert message["properties"]["delivery_info"]["routing_key"] == queue
    # kombu's Redis transport reads it as Celery's worker does.
    with Connection(url.replace("unix://", "redis+socket://")) as connection:
        simple = connection.SimpleQueue(queue, no_ack=True)
        received = simple.get(timeout=5)
        assert received.headers["id"] == task_id
        assert received.headers["root_id"] == root_id
        assert received.delivery_tag == tag
        assert received.decode() == [[batches.OWED_TURN], {}, celery_message._EMBED]
        simple.close()
