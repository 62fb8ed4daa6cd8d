"""The one authentication backend: allauth's username-and-password check, closed to
everyone but the break-glass accounts while single sign-on is the only way in.

Django's admin sign-in (/admin/login/) sends people to the login page
(harness_site.urls), so no password door stays open beside it. Single sign-on does not authenticate through a backend: allauth
signs the provider's person in directly (and names this backend in the session).
"""

from __future__ import annotations

from typing import Any

from allauth.account.auth_backends import AuthenticationBackend
from django.conf import settings
from django.http import HttpRequest


def password_sign_in_open(username: str) -> bool:
    """May `username` sign in with a password now? Always, unless HARNESS_SSO_ONLY; then
    only the accounts named in HARNESS_BREAK_GLASS_USERS."""
    return not settings.HARNESS_SSO_ONLY or username in settings.HARNESS_BREAK_GLASS_USERS


def is_break_glass(username: str) -> bool:
    """Is a password sign-in by `username` a break-glass one (audited, admins told)?"""
    return settings.HARNESS_SSO_ONLY and username in settings.HARNESS_BREAK_GLASS_USERS


class PasswordBackend(AuthenticationBackend):  # type: ignore[misc]  # allauth is untyped
    def authenticate(self, request: HttpRequest | None, **credentials: Any) -> Any:
        user = super().authenticate(request, **credentials)
        if user is None:
            return None
        if not password_sign_in_open(user.get_username()):
            return None
        # Read by identity.signals.on_signed_in: this sign-in broke the glass.
        user.harness_break_glass = is_break_glass(user.get_username())
        return user
