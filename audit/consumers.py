"""The audit timeline's socket: /ws/audit/sessions/<session_id>/ (auditors only).

Push-only, in the approvals queue's style (htmx's WebSocket extension): on connect and
after every change the socket sends the session's summary, a server-rendered fragment
that htmx swaps in by id; the page's calls fragment then reloads the page it shows over
HTTP (with the auditor's session, as any page load), so an auditor on an older or a
filtered page keeps that page. The dispatcher announces changes on a Redis channel per
session after commit; this module knows only the channel's name
(settings.HARNESS_WAKE_PREFIX), not the dispatcher.

Every socket of the dashboard is bound to its user's role and sign-in (BoundToSignIn,
also used by the approval queue): removing the role or signing out closes it at once,
and a push checks again that nothing it was opened with changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import redis.asyncio as aioredis
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth.models import User
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.crypto import constant_time_compare

from dispatcher.models import AgentSession
from identity.services import ends_at
from teams.scope import EVERYTHING, NOTHING, Scope, sign_in_scope

from .models import AuditChain
from .roles import AUDITOR, CLOSE_SOCKETS, reach, sign_in_group, user_group

SUMMARY = "audit/session.html#summary"

# The close code of a socket whose user lost the role or signed out.
CLOSED_FOR_ACCESS = 4403


def session_channel(session_id: str) -> str:
    return f"{settings.HARNESS_WAKE_PREFIX}:session:{session_id}"


class BoundToSignIn:
    """A socket that lives only as long as its user's role and sign-in: it joins the user's
    and the sign-in's groups *before* its role is checked (so a removal that lands between
    the check and the join still reaches it), and closes on audit.roles' close message.

    Messages of the types in `database_free` are handled at once. Channels runs
    close_old_connections before every handler, in a thread: the process's one shared
    sync thread, which any other socket's database call may hold (a push to 50 reviewers
    was 50 hops through it, one after another). Handlers of these types touch no database;
    the others go through channels' dispatch, and every read here is a
    database_sync_to_async, which closes stale connections itself.
    """

    scope: dict[str, Any]
    channel_layer: Any
    channel_name: str
    sign_in_groups: list[str]
    user_id: int | None = None
    # The sign-in's hash of the password (Django's session auth hash) when it opened
    user_hash: str = ""
    # The sign-in's session key ("" for none): its session must still be there at a push
    session_key: str = ""
    # The role it was opened for, its reach then, and when the sign-in ends unless the
    # person makes a page request meanwhile (identity.services.ends_at; None: never)
    role: str = ""
    reach: Scope = NOTHING
    sign_in_ends: float | None = None
    # (what a browser sends is ignored: push-only, and none of it reaches the sync thread)
    # Only types whose handlers never touch the database belong here: a handler that did,
    # other than through database_sync_to_async, would lose channels' clean-up quietly.
    database_free: frozenset[str] = frozenset({CLOSE_SOCKETS, "websocket.receive"})

    async def dispatch(self, message: dict[str, Any]) -> None:
        if message.get("type") in self.database_free:
            await getattr(self, get_handler_name(message))(message)
            return
        await super().dispatch(message)  # type: ignore[misc]  # channels' AsyncConsumer

    async def authorize(self, role: str) -> bool:
        """Join the groups, then check `role`; False (groups left) when the user lacks it
        or their sign-in has ended (idle or too old: identity.services.expiry_reason, as
        a page request would find it). The role's reach (teams.scope), read with it, is
        kept as `self.reach`."""
        user = self.scope.get("user")
        session = self.scope.get("session")
        self.sign_in_groups = []
        if user is not None and user.is_authenticated:
            self.user_id = user.pk
            self.user_hash = user.get_session_auth_hash()
            self.sign_in_groups.append(user_group(user.pk))
            if session is not None and session.session_key:
                self.session_key = session.session_key
                self.sign_in_groups.append(sign_in_group(session.session_key))
        for group in self.sign_in_groups:
            await self.channel_layer.group_add(group, self.channel_name)
        self.role, self.reach = role, NOTHING
        if user is not None:
            self.reach, self.sign_in_ends = await database_sync_to_async(_opened)(
                user, role, session
            )
        if self.reach.empty:
            await self.leave_sign_in_groups()
            return False
        return True

    async def leave_sign_in_groups(self) -> None:
        for group in getattr(self, "sign_in_groups", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        self.sign_in_groups = []

    async def still_active(self) -> bool:
        """Re-read the user before a push; close the socket (False) if they were
        deactivated, their password changed or their role's reach changed since the
        socket opened, or their sign-in has ended (idle or too old, by what the session
        said then: a page request since may have kept it going, and the page then opens
        the socket again). The close messages cover every deactivation a save or
        audit.roles.deactivate makes and every role or team change of the services; this
        covers the ones no message reached (lost: Redis down at that moment, a
        channel-layer expiry, the sender's process gone; a bulk update or a row written
        by hand, which no signal sees), a password change, which ends the person's other
        sign-ins (Django: their next request is signed out) with no message to their
        sockets, and a sign-in that ended before `end_stale_sign_ins` ran. One read,
        off channels' one shared sync thread (thread_sensitive=False), so a push to many
        sockets does not queue their reads one behind another there."""
        if (
            self.user_id is not None
            and (self.sign_in_ends is None or time.time() <= self.sign_in_ends)
            and await _sign_in_holds(
                self.user_id, self.user_hash, self.session_key, self.role, self.reach
            )
        ):
            return True
        await self.close(code=CLOSED_FOR_ACCESS)  # type: ignore[attr-defined]
        return False

    async def sockets_close(self, event: dict[str, Any]) -> None:
        assert event["type"] == CLOSE_SOCKETS
        await self.close(code=CLOSED_FOR_ACCESS)  # type: ignore[attr-defined]


def _opened(user: Any, role: str, session: Any) -> tuple[Scope, float | None]:
    """What a socket is opened with: `user`'s reach with `role` (NOTHING when their
    sign-in has ended already), and when the sign-in ends (identity.services.ends_at)."""
    now = time.time()
    ends = ends_at(session, now) if session is not None else None
    if ends is not None and now > ends:
        return NOTHING, ends
    return reach(user, role), ends


def sign_in_holds(
    user_id: int, user_hash: str, session_key: str, role: str, opened_with: Scope
) -> bool:
    """Is the user still active, with the password their sign-in was made with (its
    session auth hash, as django.contrib.auth.get_user checks it on every page request),
    their sign-in's session (`session_key`) still there (ended by a sign-out everywhere,
    an admin or the beat: deleted), and the reach with `role` the socket was opened with
    (`opened_with`)? One read by primary key (teams.scope.sign_in_scope)."""
    found = sign_in_scope(user_id, role, session_key, timezone.now())
    if found is None:
        return False
    password, now_reach = found
    now = User(pk=user_id, password=password).get_session_auth_hash()
    return now_reach == opened_with and constant_time_compare(now, user_hash)


_sign_in_holds = database_sync_to_async(sign_in_holds, thread_sensitive=False)


async def reaches(reach: Scope, session_id: str) -> bool:
    """(On the ORM thread: `_reaches`.)"""
    return bool(await database_sync_to_async(_reaches)(reach, session_id))


def _reaches(reach: Scope, session_id: str) -> bool:
    """Does `reach` cover the session's team (teams.scope)? An auditor of another
    team is refused the socket as the page refuses them (a session they cannot see)."""
    if reach.everything:
        return True
    sessions = reach.filter(AgentSession.objects.all(), "team_id")
    return bool(sessions.filter(pk=session_id).exists())


def render_summary(session_id: str, reach: Scope = EVERYTHING) -> str | None:
    """The session's summary fragment (its counts, from the chain's head row: one read,
    narrowed to `reach` in the same statement), or None when `reach` no longer covers the
    session (connect refuses such a socket; a session's team never changes, even when its
    agent moves to another team: AgentSession.team)."""
    heads = reach.filter_via(
        AuditChain.objects.filter(chain=session_id),
        "session_id",
        AgentSession.objects.all(),
        "team_id",
    )
    head = heads.first()
    if head is None:
        if not _reaches(reach, session_id):
            return None
        # No event yet: an empty summary the page can swap in all the same.
        return '<p id="audit-summary" class="audit-counts audit-summary"></p>'
    return render_to_string(SUMMARY, {"head": head}).strip()


class SessionTimelineConsumer(BoundToSignIn, AsyncWebsocketConsumer):  # type: ignore[misc]  # channels is untyped
    async def connect(self) -> None:
        session_id = str(self.scope["url_route"]["kwargs"]["session_id"])
        if not await self.authorize(AUDITOR) or not await reaches(self.reach, session_id):
            await self.leave_sign_in_groups()
            await self.close()
            return
        await self.accept()
        self.listener = asyncio.create_task(self.listen(session_id))

    async def changed(self, session_id: str) -> None:
        if not await self.still_active():
            return
        summary = await database_sync_to_async(render_summary)(session_id, self.reach)
        if summary is None:
            await self.close(code=CLOSED_FOR_ACCESS)
            return
        await self.send(text_data=summary)

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
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8.2
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
