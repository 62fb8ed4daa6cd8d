"""Every state change about a person signing in: one function each, audited in the same
transaction (docs/identity.md)."""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q

from audit import kinds
from audit.models import AuditEvent
from audit.roles import close_sockets, deactivate, sign_in_group
from audit.services import record_event

logger = logging.getLogger(__name__)


def _subject(user: User) -> str:
    return f"user:{user.get_username()}"


@transaction.atomic
def record_sso_sign_in(*, user: User, provider: str, uid: str) -> None:
    """A person signed in through an identity provider: who, through which, as whom."""
    record_event(
        kind=kinds.USER_SIGNED_IN_SSO,
        actor=_subject(user),
        subject=_subject(user),
        payload={"user": user.get_username(), "provider": provider, "uid": uid},
    )


@transaction.atomic
def record_break_glass(*, user: User, address: str) -> None:
    """A break-glass password sign-in while single sign-on is the only way in: audited as
    such, and after commit every org admin is told over the notification channels."""
    event = record_event(
        kind=kinds.USER_BREAK_GLASS,
        actor=_subject(user),
        subject=_subject(user),
        payload={"user": user.get_username(), "address": address},
    )
    transaction.on_commit(functools.partial(_send_task, NOTIFY_BREAK_GLASS_TASK, str(event.pk)))


NOTIFY_BREAK_GLASS_TASK = "identity.tasks.notify_break_glass"


def _send_task(name: str, argument: Any) -> None:
    """One Celery message, never retried here: a broker that is down costs the notice
    (logged; the audit event stays), never the sign-in."""
    try:
        current_app.send_task(name, args=(argument,), retry=False)
    except Exception:
        logger.warning("could not enqueue %s(%s)", name, argument, exc_info=True)


@transaction.atomic
def refuse_unverified_email(*, provider: str, uid: str, email: str) -> None:
    """An identity provider's person whose unverified email is an existing account's."""
    record_event(
        kind=kinds.SSO_REFUSED,
        actor=f"sso:{provider}:{uid}",
        subject=f"sso:{provider}:{uid}",
        payload={"provider": provider, "uid": uid, "email": email},
    )


@transaction.atomic
def refuse_privileged_link(*, provider: str, uid: str, email: str, user: User) -> None:
    """An identity provider's new person whose verified email is a privileged account's
    (identity.adapters.is_privileged): not linked automatically."""
    record_event(
        kind=kinds.SSO_LINK_REFUSED,
        actor=f"sso:{provider}:{uid}",
        subject=_subject(user),
        payload={"provider": provider, "uid": uid, "email": email, "user": user.get_username()},
    )


@transaction.atomic
def record_link(*, user: User, provider: str, uid: str, account_id: int, by: str) -> None:
    """An identity provider's person linked to `user`'s account (`account_id`): `by`
    "email" (allauth matched a verified email) or "connect" (the owner, signed in,
    connected the provider). What `linked_by_email` reads."""
    record_event(
        kind=kinds.SSO_LINKED,
        actor=f"sso:{provider}:{uid}" if by == "email" else _subject(user),
        subject=_subject(user),
        payload={"provider": provider, "uid": uid, "account": account_id, "by": by},
    )


def linked_by_email(account_id: int) -> bool:
    """Was the identity link `account_id` made by a verified email rather than by its
    account's owner connecting it? (A link made before links were recorded: no.)"""
    last = (
        AuditEvent.objects.filter(kind=kinds.SSO_LINKED, payload__account=account_id)
        .order_by("-pk")
        .values_list("payload__by", flat=True)
        .first()
    )
    return last == "email"


def request_address(request: Any) -> str:
    return str(getattr(request, "META", {}).get("REMOTE_ADDR", "")) if request else ""


# --- Sign-ins that end (docs/identity.md, "Sessions") ------------------------------------

SIGNED_IN_AT = "harness.signed_in_at"
SEEN_AT = "harness.seen_at"
# How often a sign-in's last activity is written (the session and its UserSession row):
# at most once a minute per sign-in, not on every request.
SEEN_EVERY = 60.0


def expiry_reason(session: Any, now: float) -> str:
    """Why this signed-in session must end now ("" if it may go on): idle longer than
    HARNESS_SESSION_IDLE, or older than HARNESS_SESSION_MAX_AGE (0 turns either off)."""
    signed_in = float(session.get(SIGNED_IN_AT, now))
    seen = float(session.get(SEEN_AT, signed_in))
    idle, max_age = settings.HARNESS_SESSION_IDLE, settings.HARNESS_SESSION_MAX_AGE
    if idle and now - seen > idle:
        return f"idle for more than {_duration(idle)}"
    if max_age and now - signed_in > max_age:
        return f"signed in more than {_duration(max_age)} ago"
    return ""


def ends_at(session: Any, now: float) -> float | None:
    """The Unix time after which this signed-in session has ended (`expiry_reason` says
    why) unless a page request notes activity first; None: never. What a socket opened
    with the session checks before every push (audit.consumers.BoundToSignIn): a sign-in
    that ended is otherwise closed only when `end_stale_sign_ins` next runs."""
    signed_in = float(session.get(SIGNED_IN_AT, now))
    seen = float(session.get(SEEN_AT, signed_in))
    idle, max_age = settings.HARNESS_SESSION_IDLE, settings.HARNESS_SESSION_MAX_AGE
    ends = [at for at in (idle and seen + idle, max_age and signed_in + max_age) if at]
    return min(ends) if ends else None


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        hours = int(seconds // 3600)
        return f"{hours} hour" + ("s" if hours != 1 else "")
    minutes = max(1, round(seconds / 60))
    return f"{minutes} minute" + ("s" if minutes != 1 else "")


def note_activity(request: Any, now: float) -> None:
    """The signed-in person did something: the session and its UserSession row say when
    (at most once a minute), the row made if missing (a sign-in from before, or through
    the admin), so every sign-in is on the person's list and ends with "everywhere"."""
    from allauth.usersessions.models import UserSession

    session = request.session
    session.setdefault(SIGNED_IN_AT, now)
    if now - float(session.get(SEEN_AT, 0)) < SEEN_EVERY:
        return
    session[SEEN_AT] = now
    if not session.session_key:
        session.save()
    UserSession.objects.create_from_request(request, user=request.user, session=session)


@transaction.atomic
def end_sign_ins(*, user: User, session_keys: list[str], actor: str, kind: str, reason: str) -> int:
    """End these sign-ins of `user`: their sessions are deleted (the next request is
    signed out), their rows go, one audit event says why, and after commit their sockets
    close. Returns how many ended."""
    from allauth.usersessions.models import UserSession
    from django.contrib.sessions.backends.db import SessionStore

    keys = sorted(set(session_keys))
    if not keys:
        return 0
    store = SessionStore()
    for key in keys:
        store.delete(key)
    UserSession.objects.filter(user=user, session_key__in=keys).delete()
    record_event(
        kind=kind,
        actor=actor,
        subject=_subject(user),
        payload={"user": user.get_username(), "sign_ins": len(keys), "reason": reason},
    )
    for key in keys:
        transaction.on_commit(functools.partial(close_sockets, sign_in_group(key)))
    return len(keys)


def sign_out_everywhere(*, user: User, current: str | None) -> int:
    """Every sign-in of `user` ends, this one (`current`) included."""
    from allauth.usersessions.models import UserSession

    keys = list(UserSession.objects.filter(user=user).values_list("session_key", flat=True))
    return end_sign_ins(
        user=user,
        session_keys=[*keys, *([current] if current else [])],
        actor=_subject(user),
        kind=kinds.USER_SIGNED_OUT_EVERYWHERE,
        reason="signed out everywhere",
    )


def end_stale_sign_ins(now: float | None = None) -> int:
    """Beat: sign-ins idle or too old end even if their browser never asks again (their
    sockets close). Returns how many ended."""
    from allauth.usersessions.models import UserSession

    moment = datetime.fromtimestamp(now if now is not None else time.time(), UTC)
    idle, max_age = settings.HARNESS_SESSION_IDLE, settings.HARNESS_SESSION_MAX_AGE
    stale = Q(pk__in=[])
    if idle:
        stale |= Q(last_seen_at__lt=moment - timedelta(seconds=idle))
    if max_age:
        stale |= Q(created_at__lt=moment - timedelta(seconds=max_age))
    ended = 0
    rows = UserSession.objects.filter(stale).select_related("user").order_by("user_id")
    by_user: dict[int, tuple[User, list[str]]] = {}
    for row in rows[:1000]:
        by_user.setdefault(row.user_id, (row.user, []))[1].append(row.session_key)
    for person, keys in by_user.values():
        ended += end_sign_ins(
            user=person,
            session_keys=keys,
            actor="harness",
            kind=kinds.SESSION_EXPIRED,
            reason="idle or too old",
        )
    return ended


# --- The identity provider says a person is gone ------------------------------------------

DEPROVISION_WINDOW = 300  # seconds a signed deprovisioning request stays acceptable


class DeprovisionRefused(Exception):
    """The request does not deactivate anyone; `status` for the view."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def check_deprovision_signature(*, timestamp: str, signature: str, body: bytes) -> None:
    """`X-Harness-Signature: sha256=<hex>` of HMAC-SHA256 over "<timestamp>.<body>" with
    HARNESS_DEPROVISION_SECRET (the scheme of Harness's own webhooks), the timestamp
    within five minutes. Raises DeprovisionRefused."""
    secret = settings.HARNESS_DEPROVISION_SECRET
    if not secret:
        raise DeprovisionRefused("Deprovisioning is off: set HARNESS_DEPROVISION_SECRET.", 404)
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > DEPROVISION_WINDOW:
        raise DeprovisionRefused("Missing or stale X-Harness-Timestamp.", 401)
    expected = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    if not hmac.compare_digest("sha256=" + expected.hexdigest(), signature):
        raise DeprovisionRefused("Bad X-Harness-Signature.", 401)


def deprovision(*, provider: str, subject: str) -> tuple[str, bool]:
    """The identity provider `provider` says its person `subject` is gone: the Harness
    account linked to them is deactivated (audit.roles.deactivate: sockets, votes, links,
    agents), in the provider's name. Returns (username, whether anything changed). Raises
    DeprovisionRefused for an unknown provider or person."""
    from allauth.socialaccount.models import SocialAccount

    if provider not in {p.id for p in settings.HARNESS_SSO}:
        raise DeprovisionRefused(f"No identity provider '{provider}' is configured.", 404)
    account = (
        SocialAccount.objects.select_related("user").filter(provider=provider, uid=subject).first()
    )
    if account is None:
        raise DeprovisionRefused(f"Nobody has signed in as '{subject}' through '{provider}'.", 404)
    changed = deactivate(user=account.user, actor=f"sso:{provider}")
    return account.user.get_username(), changed


def signed_in_recently(request: Any) -> bool:
    """Did the person signed in to this session prove who they are in the last
    ACCOUNT_REAUTHENTICATION_TIMEOUT seconds (300): a sign-in (password, single sign-on,
    passkey, second factor) or allauth's reauthentication (password, code, passkey or
    TOTP)? Read from allauth's authentication records, which it keeps in the session for
    the user they name; a session signed in otherwise (none kept) has not."""
    from allauth.account import app_settings as account_settings
    from allauth.account.internal.flows.login import get_authentication_records

    if not request.user.is_authenticated:
        return False
    times: list[float] = [
        float(record["at"])
        for record in get_authentication_records(request, request.user)
        if isinstance(record, dict) and isinstance(record.get("at"), int | float)
    ]
    if not times:
        return False
    timeout = int(account_settings.REAUTHENTICATION_TIMEOUT)
    return 0 <= time.time() - max(times) < timeout
