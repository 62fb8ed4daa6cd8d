"""The worker's message pushed directly (batches.enqueue) is the message Celery's send_task
sends: same envelope, same headers and properties, same body; only the ids and the
sender's name differ. A Celery upgrade that changes its message fails here."""

from __future__ import annotations

import base64
import json
import uuid

from celery import current_app

from dispatcher import batches
from floor import celery_message
from floor.redis_clients import redis_at

VARYING = {"id", "root_id", "origin", "correlation_id", "reply_to", "delivery_tag"}


def _shape(message: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in message.items():
        if isinstance(value, dict):
            out[key] = _shape(value)
        elif key in VARYING:
            out[key] = type(value).__name__
        else:
            out[key] = value
    return out


def test_the_pushed_message_is_the_message_send_task_sends() -> None:
    target = celery_message.raw_target(batches.EXECUTE_TASK)
    assert target is not None, "the test settings' broker is Redis: the direct push applies"
    url, _ = target
    queue = f"test-enqueue-{uuid.uuid4().hex}"  # no worker consumes it
    client = redis_at(url)
    call_id = str(uuid.uuid4())
    try:
        current_app.send_task(batches.EXECUTE_TASK, args=(call_id,), queue=queue)
        client.lpush(queue, celery_message.task_message(batches.EXECUTE_TASK, call_id, queue))
        ours_raw, theirs_raw = client.lrange(queue, 0, 1)  # LPUSH: newest first
    finally:
        client.delete(queue)
    ours, theirs = json.loads(ours_raw), json.loads(theirs_raw)
    assert _shape(ours) == _shape(theirs)
    assert base64.b64decode(ours["body"]) == base64.b64decode(theirs["body"])
    assert (
        ours["headers"]["id"] == ours["headers"]["root_id"] == ours["properties"]["correlation_id"]
    )
    assert ours["headers"]["task"] == "dispatcher.tasks.execute_call"
    assert json.loads(base64.b64decode(ours["body"]))[0] == [call_id]


def test_another_broker_is_sent_to_by_celery() -> None:
    conf = current_app.conf
    before = conf.broker_url
    try:
        # Anything redis-py and kombu may read differently goes through send_task: another
        # transport, TLS (certificate options default and parse differently), options in
        # the query string, a failover list.
        for url in (
            "amqp://guest@127.0.0.1//",
            "rediss://127.0.0.1:6380/0",
            "rediss://127.0.0.1:6380/0?ssl_cert_reqs=CERT_REQUIRED",
            "redis://127.0.0.1:6379/0?socket_timeout=3",
            "redis://127.0.0.1:6379/0;redis://127.0.0.1:6380/0",
            "redis+socket:///tmp/x.sock?virtual_host=2",
        ):
            conf.broker_url = url
            assert celery_message.raw_target(batches.EXECUTE_TASK) is None, url
        conf.broker_url = "redis+socket:///tmp/x.sock"
        assert celery_message.raw_target(batches.EXECUTE_TASK) == (
            "unix:///tmp/x.sock",
            conf.task_default_queue,
        )
    finally:
        conf.broker_url = before


def test_the_background_lanes_routes_leave_the_direct_push_on_the_execution_queue() -> None:
    """The routes send notifications and housekeeping to the background queue and name
    no execution task: the message is still pushed directly, onto the default queue. A
    route that takes the execution task elsewhere turns the direct push off."""
    from django.conf import settings

    conf = current_app.conf
    assert conf.task_routes == settings.CELERY_TASK_ROUTES
    assert conf.task_default_queue != settings.HARNESS_CELERY_BACKGROUND_QUEUE
    assert celery_message._unrouted(conf.task_routes, batches.EXECUTE_TASK)
    moved = {**conf.task_routes, batches.EXECUTE_TASK: {"queue": "elsewhere"}}
    assert not celery_message._unrouted(moved, batches.EXECUTE_TASK)
    router = current_app.amqp.router
    for task in (
        "agentauth.tasks.clear_device_codes",
        "approvals.tasks.deliver",
        "audit.tasks.write_checkpoint",
        "dispatcher.tasks.reconcile",
    ):
        assert router.route({}, task)["queue"].name == settings.HARNESS_CELERY_BACKGROUND_QUEUE
    assert router.route({}, batches.EXECUTE_TASK)["queue"].name == conf.task_default_queue
