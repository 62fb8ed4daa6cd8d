"""Live queue pushes: render a fragment once per event and send the same HTML to every socket.

Only HTML built from the database crosses the channel layer, and it is rendered once per
call transition, never once per socket. Runs after commit (see receivers).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading

from channels.layers import get_channel_layer
from django.template.loader import render_to_string

from dispatcher.models import Status

from . import queries

logger = logging.getLogger(__name__)

GROUP = "approvals"
QUEUE = "approvals/queue.html"
# Statuses a call can reach from pending_approval: the item leaves every open queue.
LEAVING = frozenset({Status.QUEUED, Status.DENIED, Status.EXPIRED, Status.CANCELLED, Status.EDITED})


def render_queue() -> str:
    """The whole pending queue, sent to a socket when it (re)connects."""
    return render_to_string(QUEUE + "#items", queries.queue_context())


def render_change(call_id: str, status: str, previous: str = "") -> str | None:
    """The fragment for one call transition, or None when no queue shows a difference.

    `previous` (the status the call left) is optional: without it every status a pending
    call can move to sends a removal, which is harmless for calls that never asked.
    """
    if previous and Status.PENDING_APPROVAL not in (previous, status):
        return None
    if status == Status.PENDING_APPROVAL:
        approval = queries.pending_for_call(call_id)
        if approval is not None:
            return render_to_string(QUEUE + "#pushed_item", {"approval": approval})
        status = Status.CANCELLED  # left pending before we rendered it: remove it
    if status in LEAVING:
        return render_to_string(QUEUE + "#removed", {"call_id": call_id})
    return None


def push_change(call_id: str, status: str, previous: str = "") -> None:
    """Tell every open queue about one call transition. Never raises: a lost push is
    repaired by the next reconnect, and a push must not break the caller's on_commit."""
    try:
        html = render_change(call_id, status, previous)
        if html is not None:
            _group_send({"type": "queue.push", "html": html})
    except Exception:
        logger.warning("could not push approval queue change for call %s", call_id, exc_info=True)


def render_progress(approval_id: int) -> str | None:
    """The quorum progress of one pending request ("1 of 2: alice"), swapped in place."""
    approval = queries.pending_by_id(approval_id)
    if approval is None:
        return None
    return render_to_string(QUEUE + "#progress_push", {"approval": approval})


def push_progress(approval_id: int) -> None:
    """Tell every open queue that a vote counted. Never raises (see push_change)."""
    try:
        html = render_progress(approval_id)
        if html is not None:
            _group_send({"type": "queue.push", "html": html})
    except Exception:
        logger.warning("could not push quorum progress of approval %s", approval_id, exc_info=True)


def _group_send(message: dict[str, str]) -> None:
    """Send on the channel layer from sync code, on this process's own event loop thread.

    One long-lived loop per process (created lazily, again after a fork) keeps one channel
    layer connection: `async_to_sync` outside a server would build a new loop, and with it
    a new Redis connection, for every push (a Celery worker, a management command).
    """
    layer = get_channel_layer()
    if layer is None:
        return
    future = asyncio.run_coroutine_threadsafe(layer.group_send(GROUP, message), _send_loop())
    try:
        future.result(timeout=10)
    except TimeoutError:
        future.cancel()  # never leave a stuck send on the loop
        raise


_loop: tuple[asyncio.AbstractEventLoop, threading.Thread] | None = None
_loop_lock = threading.Lock()


def _send_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None or not _loop[1].is_alive():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="channel-layer-sends", daemon=True
            )
            thread.start()
            _loop = (loop, thread)
        return _loop[0]


def _forget_loop_after_fork() -> None:
    """A forked child (a Celery pool process) has no loop thread: it starts its own."""
    global _loop, _loop_lock
    _loop, _loop_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_loop_after_fork)
