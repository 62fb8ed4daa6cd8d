"""People's own pages: what allauth offers that Harness does not, and their sign-ins."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import logout
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from audit import kinds
from audit.roles import factor_required, has_factor

from . import mfa, services

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
def sessions(request: HttpRequest) -> HttpResponse:
    """The signed-in person's own page: where they are signed in, and signing out there."""
    from allauth.usersessions.models import UserSession

    current = request.session.session_key
    rows = UserSession.objects.purge_and_list(request.user)
    rows.sort(key=lambda row: (row.session_key != current, -row.created_at.timestamp()))
    context = {
        "sign_ins": rows,
        "current": current,
        "idle": settings.HARNESS_SESSION_IDLE,
        "max_age": settings.HARNESS_SESSION_MAX_AGE,
    }
    return render(request, "identity/sessions.html", context)


@login_required
@require_POST
def end_sign_in(request: HttpRequest, sign_in_id: int) -> HttpResponse:
    """End one of the person's own sign-ins (another browser, a lost laptop)."""
    from allauth.usersessions.models import UserSession

    row = UserSession.objects.filter(pk=sign_in_id, user=request.user).first()
    if row is None:
        return HttpResponse("No such sign-in of yours.", status=404, content_type="text/plain")
    if row.session_key == request.session.session_key:
        return redirect("account_logout")
    services.end_sign_ins(
        user=request.user,  # type: ignore[arg-type]
        session_keys=[row.session_key],
        actor=f"user:{request.user.get_username()}",
        kind=kinds.USER_SIGNED_OUT_EVERYWHERE,
        reason="ended from the sessions page",
    )
    messages.success(request, "That sign-in has ended.")
    return redirect("identity_sessions")


@login_required
@require_POST
def sign_out_everywhere(request: HttpRequest) -> HttpResponse:
    """Every sign-in of the person ends, this one included; their sockets close."""
    user = request.user
    services.sign_out_everywhere(user=user, current=request.session.session_key)  # type: ignore[arg-type]
    logout(request)
    messages.success(request, "You are signed out everywhere.")
    return redirect("account_login")


@csrf_exempt
@require_POST
def deprovision(request: HttpRequest) -> HttpResponse:
    """POST /accounts/deprovision/: the identity provider (its workflow, a hook) says a
    person is gone: {"provider": ID, "subject": SUB}, signed with
    HARNESS_DEPROVISION_SECRET. No session and no CSRF token: the signature is the
    authentication (docs/identity.md, "Leaving")."""
    try:
        services.check_deprovision_signature(
            timestamp=request.headers.get("X-Harness-Timestamp", ""),
            signature=request.headers.get("X-Harness-Signature", ""),
            body=request.body,
        )
        data = json.loads(request.body)
        if not isinstance(data, dict) or not all(
            isinstance(data.get(key), str) and data[key] for key in ("provider", "subject")
        ):
            raise services.DeprovisionRefused(
                'The body must be {"provider": "<id>", "subject": "<the IdP\'s subject>"}.', 400
            )
        username, changed = services.deprovision(provider=data["provider"], subject=data["subject"])
    except json.JSONDecodeError:
        return JsonResponse({"error": "The body is not JSON."}, status=400)
    except services.DeprovisionRefused as refused:
        return JsonResponse({"error": str(refused)}, status=refused.status)
    return JsonResponse({"user": username, "deactivated": changed})


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
        "required": factor_required(request.user),
        "done": has_factor(request.user),
        "next": wanted if safe and wanted.startswith("/") else "/",
    }
    return render(request, "identity/mfa_setup.html", context)
