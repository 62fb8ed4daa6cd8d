"""Start-up checks for the approvals settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, register

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
