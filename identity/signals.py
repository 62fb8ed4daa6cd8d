"""Receivers: what happens when someone signs in (wired in identity.apps)."""

from __future__ import annotations

import time
from typing import Any

from . import groups, services


def on_signed_in(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    """Django's user_logged_in (the login page and the admin's): the sign-in's lifetime
    starts; a break-glass password sign-in is audited as such and the org admins are told
    (identity.backends marks it)."""
    session = getattr(request, "session", None)
    if session is not None:  # its first page request puts it on the person's list
        session[services.SIGNED_IN_AT] = time.time()
        session.pop(services.SEEN_AT, None)
    if getattr(user, "harness_break_glass", False):
        services.record_break_glass(user=user, address=services.request_address(request))


def on_sso_linked(sender: Any, request: Any, sociallogin: Any, **kwargs: Any) -> None:
    """allauth's social_account_added: how the link was made is audited, since a link made
    by a verified email never signs anyone in to a privileged account (identity.adapters),
    even when the account became privileged after."""
    from allauth.socialaccount.providers.base.constants import AuthProcess

    account = sociallogin.account
    services.record_link(
        user=sociallogin.user,
        provider=account.provider,
        uid=account.uid,
        account_id=account.pk,
        by="connect" if sociallogin.state.get("process") == AuthProcess.CONNECT else "email",
    )


def on_sso_signed_in(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    """allauth's user_logged_in: a sign-in through an identity provider is audited, and
    the person's groups become their teams and roles (identity.groups)."""
    sociallogin = kwargs.get("sociallogin")
    if sociallogin is not None:
        account = sociallogin.account
        services.record_sso_sign_in(user=user, provider=account.provider, uid=account.uid)
        # Groups become teams and roles (HARNESS_SSO_GROUP_MAP), on every sign-in.
        groups.apply(user=user, provider_id=account.provider, extra_data=account.extra_data)
