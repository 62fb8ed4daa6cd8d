"""Start-up checks for the approvals settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register

EXPIRY_ACTIONS = ("deny", "keep")


@register()
def check_expiry(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    errors = []
    if settings.HARNESS_EXPIRY_ACTION not in EXPIRY_ACTIONS:
        errors.append(
            Error(
                f"HARNESS_EXPIRY_ACTION is '{settings.HARNESS_EXPIRY_ACTION}'.",
                hint="Use 'deny' (the model is told nobody answered) or 'keep' (stays pending).",
                id="approvals.E001",
            )
        )
    if settings.HARNESS_APPROVAL_TIMEOUT <= 0:
        errors.append(
            Error(
                "HARNESS_APPROVAL_TIMEOUT must be a positive number of seconds.",
                id="approvals.E002",
            )
        )
    return errors


@register()
def check_links_and_channels(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """HARNESS_PUBLIC_URL is where every one-tap link points; the env channels need their
    parts (docs/notifications.md)."""
    problems: list[CheckMessage] = []
    url = settings.HARNESS_PUBLIC_URL
    if not url.startswith(("http://", "https://")):
        problems.append(
            Error(
                f"HARNESS_PUBLIC_URL is '{url}'.",
                hint="Set the address reviewers reach Harness at, e.g. https://harness.example.com.",
                id="approvals.E003",
            )
        )
    if settings.HARNESS_WEBHOOK_URL and len(settings.HARNESS_WEBHOOK_SECRET) < 16:
        problems.append(
            Error(
                "HARNESS_WEBHOOK_URL is set without a HARNESS_WEBHOOK_SECRET of 16 characters or more.",
                hint="Every webhook body is signed with the secret; receivers check the signature.",
                id="approvals.E004",
            )
        )
    if not settings.HARNESS_LINKS_REQUIRE_LOGIN and not url.startswith("https://"):
        problems.append(
            Warning(
                "HARNESS_LINKS_REQUIRE_LOGIN is false and HARNESS_PUBLIC_URL is not https: "
                "a link alone decides, and it travels in clear text.",
                hint="Serve Harness over HTTPS, or keep HARNESS_LINKS_REQUIRE_LOGIN=true.",
                id="approvals.W001",
            )
        )
    return problems
