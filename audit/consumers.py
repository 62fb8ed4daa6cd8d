"""Live timelines: an auditor's open session page hears of every change of the session.

Push-only, in the approvals queue's style (htmx's WebSocket extension): on connect and
after every change the socket sends the session's summary, a server-rendered fragment
that htmx swaps in by id; the page's calls fragment then reloads the page it shows over
HTTP (with the auditor's session, as any page load), so an auditor on an older or a
filtered page keeps that page. The dispatcher announces changes on a Redis channel per
session after commit; this module knows only the channel's name
(settings.HARNESS_WAKE_PREFIX), not the dispatcher.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.template.loader import render_to_string

from .models import AuditChain
from .roles import AUDITOR, has_role

SUMMARY = "audit/session.html#summary"


def session_channel(session_id: str) -> str:
    return f"{settings.HARNESS_WAKE_PREFIX}:session:{session_id}"


def render_summary(session_id: str) -> str:
    """The session's summary fragment (its counts, from the chain's head row: one read)."""
    head = AuditChain.objects.filter(chain=session_id).first()
    if head is None:  # no event yet: an empty summary the page can swap in all the same
        return '<p id="audit-summary" class="audit-counts audit-summary"></p>'
    return render_to_string(SUMMARY, {"head": head}).strip()


class SessionTimelineConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]  # channels is untyped
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not await database_sync_to_async(has_role)(user, AUDITOR):
            await self.close()
            return
        await self.accept()
        session_id = str(self.scope["url_route"]["kwargs"]["session_id"])
        self.listener = asyncio.create_task(self.listen(session_id))

    async def changed(self, session_id: str) -> None:
        await self.send(text_data=await database_sync_to_async(render_summary)(session_id))

    async def listen(self, session_id: str) -> None:
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(session_channel(session_id))
            await self.changed(session_id)  # catch up on whatever happened before
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    await self.changed(session_id)
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
