"""People's own pages: what allauth offers that Harness does not, and (later) sessions."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

NOT_OFFERED = (
    "Harness does not offer this: accounts, passwords and email addresses are managed by "
    "an administrator, or by your organization's identity provider if you sign in with it."
)


def not_offered(request: HttpRequest, **kwargs: Any) -> HttpResponse:
    """Self-service sign-up, password reset by email and email changes: 404, said plainly.

    An email address a person could add to their own account would be a way into someone
    else's single sign-on (allauth links a verified IdP email to the account holding it).
    """
    return render(request, "identity/not_offered.html", {"reason": NOT_OFFERED}, status=404)
