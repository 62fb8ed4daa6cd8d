"""Every state change about a person signing in: one function each, audited in the same
transaction (docs/identity.md)."""

from __future__ import annotations

import functools
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from audit import kinds
from audit.services import record_event


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
    from . import tasks

    event = record_event(
        kind=kinds.USER_BREAK_GLASS,
        actor=_subject(user),
        subject=_subject(user),
        payload={"user": user.get_username(), "address": address},
    )
    transaction.on_commit(functools.partial(tasks.notify_break_glass.delay, str(event.pk)))


@transaction.atomic
def refuse_unverified_email(*, provider: str, uid: str, email: str) -> None:
    """An identity provider's person whose unverified email is an existing account's."""
    record_event(
        kind=kinds.SSO_REFUSED,
        actor=f"sso:{provider}:{uid}",
        subject=f"sso:{provider}:{uid}",
        payload={"provider": provider, "uid": uid, "email": email},
    )


def request_address(request: Any) -> str:
    return str(getattr(request, "META", {}).get("REMOTE_ADDR", "")) if request else ""
