"""Sign-ins that end: idle and absolute lifetimes, checked on every page request."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth import logout
from django.http import HttpRequest, HttpResponse

from audit import kinds

from . import services


class SessionLifetime:
    """After AuthenticationMiddleware: a sign-in idle longer than HARNESS_SESSION_IDLE or
    older than HARNESS_SESSION_MAX_AGE ends here (audited, its sockets closed) and the
    request goes on signed out, so the page sends the person to the login page; any other
    sign-in's activity is noted (services.note_activity)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = request.user
        if user.is_authenticated:
            now = time.time()
            reason = services.expiry_reason(request.session, now)
            if reason:
                key = request.session.session_key
                logout(request)
                services.end_sign_ins(
                    user=user,
                    session_keys=[key] if key else [],
                    actor="harness",
                    kind=kinds.SESSION_EXPIRED,
                    reason=reason,
                )
                messages.info(request, f"You were signed out: {reason}. Sign in again.")
            else:
                services.note_activity(request, now)
        return self.get_response(request)
