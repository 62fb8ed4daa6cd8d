"""People's own pages: what allauth offers that Harness does not, and (later) sessions."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET

from . import mfa

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


@login_required
@require_GET
def me(request: HttpRequest) -> HttpResponse:
    """A person's own page: their second factors (passkeys, authenticator app, recovery
    codes), with the links to manage them."""
    return render(request, "identity/me.html", mfa.factors_of(request.user))


@login_required
@require_GET
def mfa_setup(request: HttpRequest) -> HttpResponse:
    """Where HARNESS_MFA_REQUIRED sends a person who must have a second factor and has
    none: what to set up, and (once they have one) the way back to where they were."""
    wanted = request.GET.get("next", "")
    safe = url_has_allowed_host_and_scheme(
        wanted, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    context = mfa.factors_of(request.user) | {
        "required": mfa.factor_required(request.user),
        "done": mfa.has_factor(request.user),
        "next": wanted if safe and wanted.startswith("/") else "/",
    }
    return render(request, "identity/mfa_setup.html", context)
