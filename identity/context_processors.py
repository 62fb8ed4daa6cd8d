"""Template context for the sign-in page."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest


def sign_in(request: HttpRequest) -> dict[str, Any]:
    """`sso_only`: password sign-in is for break-glass accounts only."""
    return {"sso_only": settings.HARNESS_SSO_ONLY}
