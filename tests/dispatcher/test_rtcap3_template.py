"""rtcap3: an owed turn's message was made by the give-back's script replacing the marks of
a template (celery_message.task_message_template) wherever they stood in it, so a queue
whose name held a mark's word had it replaced too: the message kombu read named another
queue, and its ids were the mark's text or the name's. Now the template is cut into its
fixed parts where the ids go when it is built, and the script puts the ids between them:
no text in the queue's name can change the message."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Connection

from dispatcher import batches
from floor import celery_message
from floor.redis_clients import redis_at
from tests.support.running_cap import mark_counted

MARKS = 'HARNESSMARKID HARNESSMARKTAG %s HARNESSMARKROOT "HARNESSMARKPARENT" \\%1'


@pytest.fixture
def lane(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[tuple[str, str]]:
    target = celery_message.raw_target(batches.EXECUTE_TASK)
    assert target is not None, "the test settings' broker is plain Redis"
    prefix = f"rtcap3-{uuid.uuid4()}"
    url, name = target[0], f"{prefix}-{MARKS}"
    monkeypatch.setattr(celery_message, "raw_target", lambda task: (url, name))
    settings.HARNESS_MAX_RUNNING_PER_OWNER = "1"
    mark_counted(redis_at(url), name)  # (a queue of its own: nothing runs yet)
    yield url, name
    broker = redis_at(url)
    leftover = list(broker.scan_iter(f"{prefix}*"))
    if leftover:
        broker.delete(*leftover)


def test_a_queue_named_with_the_marks_gets_the_owed_turns_message_celery_would_send(
    lane: tuple[str, str],
) -> None:
    url, queue = lane
    broker = redis_at(url)
    owner = batches.Share("1", str(uuid.uuid4()))
    batches.enqueue("a1", owner)
    batches.enqueue("a2", owner)
    assert broker.rpop(queue) is not None
    turn = batches.take_turn("message")
    assert turn.call_id == "a1"
    assert broker.rpop(queue) is not None
    assert batches.take_turn("message") == batches.Turn("")  # owed
    batches.end_turn(turn)  # a1 ends: the owed turn's message is sent
    assert broker.llen(queue) == 1
    task_id = str(uuid.UUID(turn.slot))
    tag = str(uuid.UUID(turn.slot[16:] + turn.slot[:16]))
    # kombu's Redis transport reads it as Celery's worker does.
    with Connection(url.replace("unix://", "redis+socket://")) as connection:
        simple = connection.SimpleQueue(queue, no_ack=True)
        received = simple.get(timeout=5)
        simple.close()
    # Before: the name's marks were replaced (the routing key named no queue of Harness's).
    assert received.delivery_info["routing_key"] == queue
    assert received.properties["delivery_info"]["routing_key"] == queue
    assert received.headers["id"] == received.properties["correlation_id"] == task_id
    assert received.headers["root_id"] == task_id and received.headers["parent_id"] is None
    assert received.delivery_tag == tag
    assert received.headers["task"] == batches.EXECUTE_TASK
    assert received.decode() == [[batches.OWED_TURN], {}, celery_message._EMBED]
