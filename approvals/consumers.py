"""The live approval queue socket: push-only; decisions travel as CSRF-protected POSTs."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from audit.consumers import BoundToSignIn
from audit.roles import CLOSE_SOCKETS, REVIEWER

from . import live


class ApprovalQueueConsumer(BoundToSignIn, AsyncWebsocketConsumer):  # type: ignore[misc]  # channels is untyped
    """Accepts active reviewers only (the origin, scheme, host and port, is checked by
    harness_site.websocket_origin),
    and only while they are: removing the role or signing out closes the socket. It
    joins the queue groups of the reviewer's reach (approvals.live.groups_of), so it
    carries the asks of their teams' agents only (all of them for an organization role);
    a reach changed since it opened (a role, a team, a move) closes it at the next push
    even when the close message was lost (BoundToSignIn.still_active), and the page opens
    it again with the reach of now.

    On every (re)connect it sends the whole current queue, so a dropped connection misses
    nothing; then it forwards the fragments rendered once per event by `live.push_change`
    (at once: forwarding reads only the user's row with their reach, in one statement,
    off the shared sync thread).
    """

    database_free = frozenset({CLOSE_SOCKETS, "websocket.receive", "queue.push"})

    async def connect(self) -> None:
        if not await self.authorize(REVIEWER):
            await self.close()
            return
        # The reviewer's reach, read with the role: the queue groups of their teams (or
        # the organization's), and a queue of those teams' asks only.
        self.queue_groups = live.groups_of(self.reach)
        for group in self.queue_groups:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send(text_data=await database_sync_to_async(live.render_queue)(self.reach))

    async def disconnect(self, code: int) -> None:
        await self.leave_sign_in_groups()
        for group in getattr(self, "queue_groups", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Ignored: nothing a browser sends over this socket changes anything."""

    async def queue_push(self, event: dict[str, Any]) -> None:
        if await self.still_active():
            # An escalated ask's second rendering, for a reviewer who sees it only through
            # the escalation (no "allow for the session": live._pushed_item)
            html = event["html"]
            if "escalated_html" in event and not self.reach.covers(event.get("team")):
                html = event["escalated_html"]
            await self.send(text_data=html)
