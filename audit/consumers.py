"""Live timelines: an auditor's open session page hears of every change of the session.

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

from .roles import AUDITOR, has_role


def session_channel(session_id: str) -> str:
    return f"{settings.HARNESS_WAKE_PREFIX}:session:{session_id}"


class SessionTimelineConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]  # channels is untyped
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not await database_sync_to_async(has_role)(user, AUDITOR):
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
        listener = getattr(self, "listener", None)
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await listener
