"""Live timelines: an auditor's open session page hears of every change of the session.

Every socket of the dashboard is bound to its user's role and sign-in (BoundToSignIn,
also used by the approval queue): removing the role or signing out closes it at once.

Push-only: the socket carries a one-word "changed" per change and the page re-fetches its
calls fragment over HTTP (with the auditor's session, as any page load). The dispatcher
announces changes on a Redis channel per session after commit; this module knows only
the channel's name (settings.HARNESS_WAKE_PREFIX), not the dispatcher.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from .roles import AUDITOR, CLOSE_SOCKETS, has_role, sign_in_group, user_group

# The close code of a socket whose user lost the role or signed out.
CLOSED_FOR_ACCESS = 4403


def session_channel(session_id: str) -> str:
    return f"{settings.HARNESS_WAKE_PREFIX}:session:{session_id}"


class BoundToSignIn:
    """A socket that lives only as long as its user's role and sign-in: it joins the user's
    and the sign-in's groups *before* its role is checked (so a removal that lands between
    the check and the join still reaches it), and closes on audit.roles' close message."""

    scope: dict[str, Any]
    channel_layer: Any
    channel_name: str
    sign_in_groups: list[str]

    async def authorize(self, role: str) -> bool:
        """Join the groups, then check `role`; False (groups left) when the user lacks it."""
        user = self.scope.get("user")
        session = self.scope.get("session")
        self.sign_in_groups = []
        if user is not None and user.is_authenticated:
            self.sign_in_groups.append(user_group(user.pk))
            if session is not None and session.session_key:
                self.sign_in_groups.append(sign_in_group(session.session_key))
        for group in self.sign_in_groups:
            await self.channel_layer.group_add(group, self.channel_name)
        if user is None or not await database_sync_to_async(has_role)(user, role):
            await self.leave_sign_in_groups()
            return False
        return True

    async def leave_sign_in_groups(self) -> None:
        for group in getattr(self, "sign_in_groups", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        self.sign_in_groups = []

    async def sockets_close(self, event: dict[str, Any]) -> None:
        assert event["type"] == CLOSE_SOCKETS
        await self.close(code=CLOSED_FOR_ACCESS)  # type: ignore[attr-defined]


class SessionTimelineConsumer(BoundToSignIn, AsyncWebsocketConsumer):  # type: ignore[misc]  # channels is untyped
    async def connect(self) -> None:
        if not await self.authorize(AUDITOR):
            await self.close()
            return
        await self.accept()
        channel = session_channel(str(self.scope["url_route"]["kwargs"]["session_id"]))
        self.listener = asyncio.create_task(self.listen(channel))

    async def listen(self, channel: str) -> None:
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(channel)
            await self.send(text_data="changed")  # catch up on whatever happened before
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    await self.send(text_data="changed")
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
                await client.aclose()

    async def receive(self, text_data: Any = None, bytes_data: Any = None) -> None:
        """Push-only: whatever the browser sends is ignored."""

    async def disconnect(self, code: int) -> None:
        await self.leave_sign_in_groups()
        listener = getattr(self, "listener", None)
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await listener
