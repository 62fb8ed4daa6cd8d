"""Who may do what: the three roles, checked in one place and changed through one
audited service.

A role is held organization-wide (the Django group of that name: `reviewer` decides
calls, `auditor` reads the log, `admin` changes modes, rules and agents; a superuser holds
all three) or in teams (teams.Membership). Holding a role anywhere opens its pages;
which agents, sessions and asks a page then shows is the role's reach (teams.scope).
Only an active user holds any role. Views use `role_required` (which sets the role's reach
on the request, `request.reach`), sockets and services `reach` (or `has_role` when the reach
does not matter), templates the `roles` context value; granting and removing go through `grant_role` / `remove_role`,
each with its audit event (the admin shows users and groups read-only).

Open sockets are bound to the role and the sign-in they were opened with: each joins its
user's group and its sign-in's group on the channel layer, and `remove_role` (after
commit) and signing out (`close_signed_out_sockets`, on user_logged_out) send those
groups a close, so a removed reviewer or a signed-out browser stops receiving at once.
Deactivating a user does the same: `deactivate` (audited), and any save of an inactive
user (`close_deactivated_sockets`, on post_save: the shell, an identity provider's sync);
a deactivation no signal sees (a bulk update) is caught by the sockets themselves, which
re-read `is_active` before every push (audit.consumers.BoundToSignIn).
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from functools import wraps
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.utils.cache import add_never_cache_headers
from django.utils.module_loading import import_string
from django_htmx.middleware import HtmxDetails

from teams.models import Membership, Team
from teams.scope import Scope, scope_of

from . import kinds
from .models import AuditEvent
from .services import record_event

logger = logging.getLogger(__name__)

REVIEWER = "reviewer"
AUDITOR = "auditor"
ADMIN = "admin"
ROLES = frozenset({REVIEWER, AUDITOR, ADMIN})

REFUSALS = {
    REVIEWER: "Only reviewers can see and decide calls.",
    AUDITOR: "Only auditors can read the audit log.",
    ADMIN: "Only administrators can see and change permissions.",
}


def roles_of(user: Any) -> frozenset[str]:
    """The roles `user` holds now (none unless signed in and active)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return frozenset()
    if user.is_superuser:
        return ROLES
    org = user.groups.filter(name__in=ROLES).values_list("name", flat=True)
    teams = Membership.objects.filter(user_id=user.pk).order_by().values_list("role", flat=True)
    return frozenset(org.order_by().union(teams))


def has_role(user: Any, role: str) -> bool:
    """Does `user` hold `role` in the organization or in any team (the read that also
    gives its reach: `reach`)?"""
    return not reach(user, role).empty


def reach(user: Any, role: str) -> Scope:
    """The teams `user` reaches with `role` (teams.scope): empty when they lack it. One
    statement; pages get it from `role_required` as `request.reach`, so a page's scoping
    costs nothing beyond its role check."""
    if role not in ROLES:
        raise ValueError(f"Unknown role '{role}'. Roles: {', '.join(sorted(ROLES))}.")
    return scope_of(user, role)


def factor_required(user: Any) -> bool:
    """True when HARNESS_MFA_REQUIRED names `user`'s roles (unknown values: everyone,
    failing closed; identity.E101 names them). Read by identity.mfa's gates, and by a
    one-tap link deciding for a person who is not signed in (approvals.links)."""
    level = settings.HARNESS_MFA_REQUIRED
    if level == "none" or not user.is_authenticated:
        return False
    if level == "admins":
        return has_role(user, ADMIN)
    if level == "reviewers":
        return has_role(user, REVIEWER) or has_role(user, ADMIN)
    return True


def has_factor(user: Any) -> bool:
    """An authenticator app or a passkey (recovery codes alone are not a factor)."""
    from allauth.mfa.models import Authenticator

    types = (Authenticator.Type.TOTP, Authenticator.Type.WEBAUTHN)
    return bool(Authenticator.objects.filter(user_id=user.pk, type__in=types).exists())


def lacks_required_factor(user: Any) -> bool:
    """A person HARNESS_MFA_REQUIRED names who has no second factor yet: signed in, they
    reach no page but the set-up one (identity.mfa.RequireSecondFactor)."""
    return (
        settings.HARNESS_MFA_REQUIRED != "none" and factor_required(user) and not has_factor(user)
    )


class HtmxHttpRequest(HttpRequest):
    """A request as a view behind `role_required` gets it: django-htmx's details, and the
    signed-in user (django-htmx's example types its views the same way)."""

    htmx: HtmxDetails
    # role_required lets no anonymous user through.
    user: User
    # The teams the page's role reaches (teams.scope), read with the role check.
    reach: Scope


def role_required(
    role: str,
) -> Callable[[Callable[..., HttpResponseBase]], Callable[..., HttpResponseBase]]:
    """A view for holders of `role`: others are sent to sign in, or refused (403)."""

    def decorate(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            scope = reach(request.user, role)
            if scope.empty:
                raise PermissionDenied(REFUSALS[role])
            request.reach = scope  # type: ignore[attr-defined]
            response = view(request, *args, **kwargs)
            # What a role's page shows (agents' arguments, the log) is read live, never
            # kept: not in the browser's cache on disk, nor shown again by its back button
            # after the person signed out or lost the role.
            add_never_cache_headers(response)
            return response

        # Read by tests/test_view_access.py: every page says its role.
        wrapped.required_role = role  # type: ignore[attr-defined]
        return wrapped

    return decorate


def _check(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"Unknown role '{role}'. Roles: {', '.join(sorted(ROLES))}.")


@transaction.atomic
def grant_role(*, user: User, role: str, actor: str) -> bool:
    """Give `user` the role; False (and no event) if they held it already."""
    _check(role)
    group, _ = Group.objects.get_or_create(name=role)
    if user.groups.filter(pk=group.pk).exists():
        return False
    user.groups.add(group)
    record_event(
        kind=kinds.ROLE_GRANTED,
        actor=actor,
        subject=f"user:{user.get_username()}",
        payload={"user": user.get_username(), "role": role},
    )
    return True


@transaction.atomic
def remove_role(*, user: User, role: str, actor: str) -> bool:
    """Take the role from `user`; False (and no event) if they did not hold it. After
    commit, every socket the user has open is closed (a socket that still fits another
    role the user holds is opened again by its page and re-checked)."""
    _check(role)
    group = Group.objects.filter(name=role).first()
    if group is None or not user.groups.filter(pk=group.pk).exists():
        return False
    user.groups.remove(group)
    payload: dict[str, Any] = {"user": user.get_username(), "role": role}
    if role == ADMIN:
        payload |= _left_unjoined_teams(user=user, actor=actor)
    record_event(
        kind=kinds.ROLE_REMOVED,
        actor=actor,
        subject=f"user:{user.get_username()}",
        payload=payload,
    )
    transaction.on_commit(functools.partial(close_sockets, user_group(user.pk)))
    return True


def _left_unjoined_teams(*, user: User, actor: str) -> dict[str, Any]:
    """An organization admin reaches every team without joining it: losing the role is
    leaving each team they hold no membership of, so the steps of leaving a team
    (settings.HARNESS_TEAM_LEFT_STEPS: their signed-in agents there stop, a token of its
    agents they were shown is voided) run for each such team with an active agent (theirs
    or another's: one whose token they were shown). Each step checks again what they
    still reach (a superuser reaches all)."""
    teams = (
        Team.objects.filter(agents__is_active=True)
        .exclude(memberships__user=user)
        .distinct()
        .order_by("pk")
    )
    done: dict[str, Any] = {}
    for team in teams:
        for step in [_import_step(path) for path in settings.HARNESS_TEAM_LEFT_STEPS]:
            for key, value in step(team=team, user=user, actor=actor).items():
                done[key] = [*done.get(key, []), *value] if isinstance(value, list) else value
    return done


# --- Sockets bound to a role and a sign-in -------------------------------------------------

# The channel-layer message that closes a socket (consumers handle it as `sockets_close`).
CLOSE_SOCKETS = "sockets.close"


def user_group(user_id: object) -> str:
    """Every open socket of one user."""
    return f"harness.user.{user_id}"


def sign_in_group(session_key: str) -> str:
    """Every open socket of one sign-in (a hash: session keys never reach Redis)."""
    return "harness.signin." + hashlib.sha256(session_key.encode()).hexdigest()[:40]


def close_sockets(group: str) -> None:
    """Close every socket in `group`. Runs after commit; never raises (a socket that
    missed the close is still refused at its next connect, which checks the role)."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, {"type": CLOSE_SOCKETS})
    except Exception:
        logger.warning("could not close the sockets of %s", group, exc_info=True)


@transaction.atomic
def deactivate(*, user: User, actor: str, sponsor: User | None = None) -> bool:
    """Deactivate `user`, in one transaction with its audit event: they hold no role from
    now on; each step in settings.HARNESS_DEACTIVATION_STEPS runs (their votes on pending
    calls are voided, their agents revoked or, with `sponsor`, handed to the sponsor);
    their one-tap links decide nothing, now or if the account comes back (approvals.links
    reads `is_active` and this event); and after commit every socket they have open is
    closed. False (and no event) if they were inactive already."""
    if not User.objects.filter(pk=user.pk, is_active=True).update(is_active=False):
        return False
    user.is_active = False
    payload: dict[str, Any] = {"user": user.get_username()}
    if sponsor is not None:
        payload["sponsor"] = sponsor.get_username()
    for step in deactivation_steps():
        payload |= step(user=user, actor=actor, sponsor=sponsor)
    record_event(
        kind=kinds.USER_DEACTIVATED,
        actor=actor,
        subject=f"user:{user.get_username()}",
        payload=payload,
    )
    transaction.on_commit(functools.partial(close_sockets, user_group(user.pk)))
    return True


def deactivation_steps() -> list[Callable[..., dict[str, Any]]]:
    """settings.HARNESS_DEACTIVATION_STEPS, imported (named there, not imported here: the
    steps live in the apps above audit; checked at start-up, audit.E010)."""
    return [_import_step(path) for path in settings.HARNESS_DEACTIVATION_STEPS]


@functools.cache
def _import_step(path: str) -> Callable[..., dict[str, Any]]:
    step: Callable[..., dict[str, Any]] = import_string(path)
    return step


def deactivated_since(user: User, when: float) -> bool:
    """Was `user` deactivated (by `deactivate`) at or after the Unix time `when`? What a
    one-tap link made before then reads: it never decides again, even if the account is
    made active again."""
    return AuditEvent.objects.filter(
        kind=kinds.USER_DEACTIVATED,
        subject=f"user:{user.get_username()}",
        created_at__gte=datetime.fromtimestamp(when, UTC),
    ).exists()


def close_deactivated_sockets(sender: Any, instance: User, **kwargs: Any) -> None:
    """post_save of a user: an inactive user's sockets close after commit (a save that
    leaves them inactive closes none, since they could not open any)."""
    if not instance.is_active:
        transaction.on_commit(functools.partial(close_sockets, user_group(instance.pk)))


def still_active(user_id: int) -> bool:
    """Is the user still active? One read by primary key, for a socket before a push."""
    return User.objects.filter(pk=user_id, is_active=True).exists()


def close_signed_out_sockets(
    sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any
) -> None:
    """user_logged_out: the sockets opened with this sign-in close with it."""
    key = getattr(getattr(request, "session", None), "session_key", None)
    if key:
        close_sockets(sign_in_group(key))
