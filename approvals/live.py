"""Live queue pushes: render a fragment once per event and send the same HTML to every
socket that may see it.

Only HTML built from the database crosses the channel layer, and it is rendered once per
call transition, never once per socket. Runs after commit (see receivers).

Sockets join groups by reach (teams.scope): an organization reviewer's socket joins
`GROUP`, a team reviewer's the group of each of their teams (`team_group`). Every push
about a call goes to `GROUP` and to its agent's team's group only, so a socket never
carries another team's asks, not even a removal naming one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from importlib import metadata
from typing import Any

from channels.layers import get_channel_layer
from channels_redis.pubsub import RedisPubSubChannelLayer, RedisPubSubLoopLayer
from django.template.loader import render_to_string

from dispatcher.models import Status, ToolCall
from floor.redis_clients import RoundTrip, held
from teams.scope import Scope, ask_teams

from . import queries
from .models import ApprovalRequest

logger = logging.getLogger(__name__)

GROUP = "approvals"
# The channels_redis line `_Publisher` was verified with (its internals: the layer's
# `_args`/`_kwargs`, the loop layer's group naming, `serialize`). pyproject allows any
# 4.x: on another line the layer's own group_send sends, and a warning says so.
VERIFIED_WITH = {"channels-redis": "4.3"}
QUEUE = "approvals/queue.html"
# Statuses a call can reach from pending_approval: the item leaves every open queue.
LEAVING = frozenset({Status.QUEUED, Status.DENIED, Status.EXPIRED, Status.CANCELLED, Status.EDITED})


def team_group(team_id: int) -> str:
    """The open queues of one team's reviewers."""
    return f"{GROUP}.team.{team_id}"


def groups_of(reach: Scope) -> list[str]:
    """The groups a reviewer's socket joins: everything's, or one per team reached."""
    if reach.everything:
        return [GROUP]
    return [team_group(team_id) for team_id in sorted(reach.team_ids)]


def render_queue(reach: Scope) -> str:
    """The pending queue `reach` sees, sent to a socket when it (re)connects."""
    return render_to_string(QUEUE + "#items", queries.queue_context(reach))


def render_change(call_id: str, status: str, previous: str = "") -> str | None:
    """The fragment for one call transition, or None when no queue shows a difference."""
    rendered = _render_change(call_id, status, previous)
    return rendered[0]["html"] if rendered is not None else None


# The teams whose queues see an ask (teams.scope.ask_teams: its agent's team, and the
# team it escalated to); None in it: none.
Teams = tuple[int | None, ...]


def _render_change(
    call_id: str, status: str, previous: str = ""
) -> tuple[dict[str, Any], Teams | None] | None:
    """The push for one call transition (a `queue.push` message), with the teams whose
    queues see the call when the read gave them (None: not read), or None when no queue
    shows a difference.

    `previous` (the status the call left) is optional: without it every status a pending
    call can move to sends a removal, which is harmless for calls that never asked.
    """
    if previous and Status.PENDING_APPROVAL not in (previous, status):
        return None
    if status == Status.PENDING_APPROVAL:
        approval = queries.pending_for_call(call_id)
        if approval is not None:
            return _pushed_item(approval), ask_teams(approval)
        status = Status.CANCELLED  # left pending before we rendered it: remove it
    if status in LEAVING:
        removed = render_to_string(QUEUE + "#removed", {"call_id": call_id})
        return {"type": "queue.push", "html": removed}, None
    return None


def _pushed_item(approval: ApprovalRequest) -> dict[str, Any]:
    """The queue push of a pending ask. One that escalated to another team carries a second
    rendering for the reviewers who see it only through the escalation (without "allow for
    the session", which they may not grant: services._escalated_only); each queue socket
    forwards the one its reviewer's reach calls for (consumers.ApprovalQueueConsumer)."""
    html = render_to_string(QUEUE + "#pushed_item", {"approval": approval})
    message: dict[str, Any] = {"type": "queue.push", "html": html}
    team = approval.call.session.team_id
    if approval.escalated_to_id is not None and approval.escalated_to_id != team:
        approval.escalated_only = True
        try:
            message["escalated_html"] = render_to_string(
                QUEUE + "#pushed_item", {"approval": approval}
            )
        finally:
            approval.escalated_only = False
        message["team"] = team
    return message


def push_change(
    call_id: str, status: str, previous: str = "", team_id: Teams | None = None
) -> None:
    """Tell the open queues that may see it about one call transition (`team_id`: the
    teams that see the call, when the caller read them already). Never raises: a lost push
    is repaired by the next reconnect, and a push must not break the caller's on_commit."""
    try:
        rendered = _render_change(call_id, status, previous)
        if rendered is not None:
            message, team = rendered
            team = team if team is not None else team_id
            if team is None:
                team = team_of_call(call_id)
            _send_to(team, message)
    except Exception:
        logger.warning("could not push approval queue change for call %s", call_id, exc_info=True)


def team_of_call(call_id: str) -> Teams | None:
    """The teams that see a call (its agent's, and the one its ask escalated to; None: no
    such call): for a removal whose caller did not read them."""
    row = (
        ToolCall.objects.filter(pk=call_id)
        .values_list("session__team_id", "approval__escalated_to_id")
        .first()
    )
    return tuple(row) if row else None


def _send_to(teams: Teams | None, message: dict[str, Any]) -> None:
    """`message` to the organization's queues and to those of the teams (if any)."""
    teams_groups = [team_group(t) for t in sorted({t for t in teams or () if t is not None})]
    _group_send([GROUP, *teams_groups], message)


def push_escalation(approval_id: int) -> None:
    """An ask escalated: shown anew (marked escalated) to every queue that sees it now,
    the next tier's included. Never raises (see push_change)."""
    try:
        approval = queries.pending_by_id(approval_id)
        if approval is None:
            return
        queries.attach_history([approval])
        _send_to(ask_teams(approval), _pushed_item(approval))
    except Exception:
        logger.warning("could not push the escalation of approval %s", approval_id, exc_info=True)


def render_progress(approval_id: int) -> tuple[str, Teams] | None:
    """The quorum progress of one pending request ("1 of 2: alice"), swapped in place,
    with the team of its agent."""
    approval = queries.pending_by_id(approval_id)
    if approval is None:
        return None
    html = render_to_string(QUEUE + "#progress_push", {"approval": approval})
    return html, ask_teams(approval)


def push_progress(approval_id: int) -> None:
    """Tell the open queues that see the request that a vote counted. Never raises (see
    push_change)."""
    try:
        rendered = render_progress(approval_id)
        if rendered is not None:
            html, team_id = rendered
            _send_to(team_id, {"type": "queue.push", "html": html})
    except Exception:
        logger.warning("could not push quorum progress of approval %s", approval_id, exc_info=True)


def _group_send(groups: list[str], message: dict[str, Any]) -> None:
    """Send on the channel layer from sync code to each of `groups` at once (a decision's
    removal goes to the organization's queues and its team's).

    On Redis's pub/sub layer (the deployed one, `_publisher`), the groups' PUBLISHes,
    named and serialized by the layer itself, go in one round trip from this thread: kept
    for the thread's round trip when one is open (`redis_clients.one_round_trip`: a
    decision sends them with its wake-up), else pipelined now. A PUBLISH that fails is
    logged and loses no other group's.

    Any other layer: on this process's own event loop thread (one handoff to the loop,
    the sends side by side). One long-lived loop per process (created lazily, again after
    a fork) keeps one channel layer connection: `async_to_sync` outside a server would
    build a new loop, and with it a new Redis connection, for every push (a Celery worker,
    a management command).
    """
    layer = get_channel_layer()
    if layer is None:
        return
    publisher = _publisher(layer)
    if publisher is not None:
        publisher.publish(layer, groups, message)
        return

    async def send_all() -> None:
        sent = await asyncio.gather(
            *(layer.group_send(group, message) for group in groups), return_exceptions=True
        )
        if failed := next((r for r in sent if isinstance(r, BaseException)), None):
            raise failed  # (after every group had its send: one failure loses no other)

    future = asyncio.run_coroutine_threadsafe(send_all(), _send_loop())
    try:
        future.result(timeout=10)
    except TimeoutError:
        future.cancel()  # never leave a stuck send on the loop
        raise


class _Publisher:
    """The groups' PUBLISHes of a Redis pub/sub channel layer, sent from sync code: each
    group's channel named by the layer's own `_get_group_channel_name`, the message
    serialized by the layer's own `serialize` (its format and any encryption keys), to
    the one Redis server it publishes on. Leans on channels_redis's internals (the layer's
    `_args`/`_kwargs`, `RedisPubSubLoopLayer._get_group_channel_name`): built only on
    the channels_redis line of `VERIFIED_WITH` (tests/approvals/test_decision_pushes.py,
    tests/redteam/test_rt8pub_*.py: its pushes are received through the layer itself)."""

    def __init__(self, loop_layer: Any, url: str) -> None:
        # (the layer itself is not kept, nor named by `loop_layer`: `_publishers`, whose
        # values these are, forgets a layer no longer used)
        self.loop_layer, self.url = loop_layer, url

    def publish(self, layer: Any, groups: list[str], message: dict[str, Any]) -> None:
        data = layer.serialize(message)
        trip = held(self.url)
        pending = trip if trip is not None else RoundTrip(self.url)
        for group in groups:
            channel = self.loop_layer._get_group_channel_name(group)
            pending.add(("PUBLISH", channel, data), f"the queue push to {group}")
        if trip is None:
            pending.send()


_publishers: weakref.WeakKeyDictionary[Any, _Publisher | None] = weakref.WeakKeyDictionary()


def _publisher(layer: Any) -> _Publisher | None:
    """The sync publisher of `layer` when it is channels_redis's pub/sub layer on one
    Redis server given by URL (the deployed configuration); None for any other layer,
    which is sent to through its own `group_send`."""
    if layer not in _publishers:
        publisher = None
        try:
            hosts = layer._kwargs.get("hosts") if type(layer) is RedisPubSubChannelLayer else None
            if isinstance(hosts, list | tuple) and len(hosts) == 1 and isinstance(hosts[0], str):
                publisher = _verified(layer, hosts[0])
        except Exception:  # a channels_redis whose internals moved: its own group_send
            logger.warning("the channel layer's groups are sent to by its loop", exc_info=True)
        _publishers[layer] = publisher
    return _publishers[layer]


def _verified(layer: Any, url: str) -> _Publisher | None:
    """The publisher of a one-URL pub/sub layer when the installed channels_redis is the
    line it was verified with (`VERIFIED_WITH`); else None (a warning: the layer's own
    group_send sends, which a moved naming or serialization cannot mislead)."""
    (package, line), *_ = VERIFIED_WITH.items()
    installed = ".".join(metadata.version(package).split(".")[:2])
    if installed != line:
        logger.warning(
            "the channel layer's groups are sent to by its loop: %s %s is installed, the "
            "decision's pipeline (approvals.live) was verified with %s.x",
            package,
            installed,
            line,
        )
        return None
    # (built without a running loop, it opens nothing until a coroutine of its runs:
    # only its naming is used, looked up now so that a missing one falls back here)
    loop_layer = RedisPubSubLoopLayer(*layer._args, **layer._kwargs, channel_layer=None)
    loop_layer._get_group_channel_name  # noqa: B018
    return _Publisher(loop_layer, url)


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
