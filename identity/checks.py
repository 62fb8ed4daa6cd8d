"""Start-up checks of sign-in settings (no database access)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register


@register()
def check_sso_only(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    if settings.HARNESS_SSO_ONLY and not settings.HARNESS_SSO:
        messages.append(
            Error(
                "HARNESS_SSO_ONLY is true but no identity provider is configured: nobody "
                "but the break-glass accounts could sign in.",
                hint="Set HARNESS_OIDC_ISSUER (and its client) or HARNESS_SSO_PROVIDERS, "
                "or unset HARNESS_SSO_ONLY (docs/identity.md).",
                id="identity.E001",
            )
        )
    if settings.HARNESS_SSO_ONLY and not settings.HARNESS_BREAK_GLASS_USERS:
        messages.append(
            Warning(
                "HARNESS_SSO_ONLY is true and HARNESS_BREAK_GLASS_USERS is empty: when the "
                "identity provider is down, nobody can sign in to Harness.",
                hint="Name one or two local admin accounts in HARNESS_BREAK_GLASS_USERS.",
                id="identity.W002",
            )
        )
    if settings.HARNESS_BREAK_GLASS_USERS and not settings.HARNESS_SSO_ONLY:
        messages.append(
            Warning(
                "HARNESS_BREAK_GLASS_USERS is set but HARNESS_SSO_ONLY is not: every local "
                "account signs in with its password, and none of them is a break-glass one.",
                hint="Set HARNESS_SSO_ONLY=true, or unset HARNESS_BREAK_GLASS_USERS.",
                id="identity.W003",
            )
        )
    return messages
