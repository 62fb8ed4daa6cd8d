"""Second factors a role requires (HARNESS_MFA_REQUIRED), and the start-up check of it.

A person the setting names (none; admins; reviewers, admins included; all) who has no
second factor yet (an authenticator app or a passkey, allauth.mfa) is sent to the set-up
page before any other page: their first sign-in ends there. Their own pages under
/accounts/ (adding the factor, signing out) stay open, and so do the agent API and the
static files, which no person's session reaches. Who must have one and whether they do
is read in audit.roles (`lacks_required_factor`), where a one-tap link deciding for a
person who is not signed in reads it too (approvals.links).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.core.checks import Error, register
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse

from audit.roles import lacks_required_factor

LEVELS = ("none", "admins", "reviewers", "all")
# Paths a person without their required factor may still reach, as Django resolves them
# (`path_info`: without the root path, which a client may name: daphne takes it from any
# request's Daphne-Root-Path header).
OPEN_PATHS = ("/accounts/", "/static/", "/api/")


def factors_of(user: Any) -> dict[str, Any]:
    """`user`'s passkeys (name, when added, whether it signs in without a password),
    whether an authenticator app is set up, and how many recovery codes are left."""
    from allauth.mfa.models import Authenticator

    passkeys, totp, codes_left = [], False, None
    for row in Authenticator.objects.filter(user_id=user.pk).order_by("created_at"):
        wrapped: Any = row.wrap()
        if row.type == Authenticator.Type.WEBAUTHN:
            passkeys.append(
                {
                    "name": wrapped.name,
                    "created_at": row.created_at,
                    "last_used_at": row.last_used_at,
                    "passwordless": bool(wrapped.is_passwordless),
                }
            )
        elif row.type == Authenticator.Type.TOTP:
            totp = True
        elif row.type == Authenticator.Type.RECOVERY_CODES:
            codes_left = len(wrapped.get_unused_codes())
    return {"passkeys": passkeys, "totp": totp, "codes_left": codes_left}


class RequireSecondFactor:
    """Middleware: send a person who must have a second factor and has none to set one up."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if (
            settings.HARNESS_MFA_REQUIRED != "none"
            and not request.path_info.startswith(OPEN_PATHS)
            and lacks_required_factor(request.user)
        ):
            setup = reverse("identity_mfa_setup")
            if request.method != "GET" or request.headers.get("HX-Request"):
                message = "Set up a second factor first: " + setup
                return JsonResponse({"error": message}, status=403)
            return redirect(f"{setup}?{urlencode({'next': request.get_full_path()})}")
        return self.get_response(request)


class SecondFactorSocketGate:
    """ASGI middleware for the reviewers' sockets (inside AuthMiddlewareStack): a person
    RequireSecondFactor would send to the set-up page opens no live socket either (the
    queue's pushes carry the calls a page would show)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: Any, receive: Any, send: Any) -> Any:
        if settings.HARNESS_MFA_REQUIRED != "none" and scope["type"] == "websocket":
            user = scope.get("user")
            if user is not None and await _lacks_factor(user):
                await receive()  # the handshake's websocket.connect
                await send({"type": "websocket.close", "code": 4403})
                return None
        return await self.inner(scope, receive, send)


async def _lacks_factor(user: Any) -> bool:
    from asgiref.sync import sync_to_async

    return bool(await sync_to_async(lacks_required_factor)(user))


@register()
def check_mfa_required(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    if settings.HARNESS_MFA_REQUIRED in LEVELS:
        return []
    return [
        Error(
            f"HARNESS_MFA_REQUIRED is '{settings.HARNESS_MFA_REQUIRED}'.",
            hint=f"Use one of: {', '.join(LEVELS)}.",
            id="identity.E101",
        )
    ]
