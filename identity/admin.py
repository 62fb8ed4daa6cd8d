"""allauth's models in the admin, read-only as every other model (harness_site.admin).

allauth registers editable admins for them. Through those, a staff session would add a
passkey to its own account (or anyone's) without allauth's reauthentication, unaudited,
and then sign step-up approvals with it (approvals.stepup); link an identity provider's
subject or a verified email to any account; read authenticator secrets (TOTP seeds,
recovery codes) and provider tokens. People manage their own factors and connected
accounts on their own pages (/accounts/), which ask who they are first; single sign-on
is configured from the environment (identity.sso_config).
"""

from __future__ import annotations

from allauth.account.models import EmailAddress
from allauth.mfa.models import Authenticator
from allauth.socialaccount.models import SocialAccount, SocialApp, SocialToken
from allauth.usersessions.models import UserSession
from django.contrib import admin

from harness_site.admin import ReadOnlyAdmin

# (allauth's apps come before this one in INSTALLED_APPS: their admins are registered.)
for _model in (Authenticator, EmailAddress, SocialAccount, SocialApp, SocialToken, UserSession):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)


@admin.register(Authenticator)
class AuthenticatorAdmin(ReadOnlyAdmin):
    list_display = ["user", "type", "created_at", "last_used_at"]
    list_filter = ["type"]
    exclude = ["data"]  # TOTP seeds, recovery codes, passkeys' registrations


@admin.register(EmailAddress)
class EmailAddressAdmin(ReadOnlyAdmin):
    list_display = ["email", "user", "primary", "verified"]


@admin.register(SocialAccount)
class SocialAccountAdmin(ReadOnlyAdmin):
    list_display = ["user", "provider", "uid", "last_login"]


@admin.register(SocialApp)
class SocialAppAdmin(ReadOnlyAdmin):
    list_display = ["name", "provider", "provider_id"]
    exclude = ["secret", "key", "settings"]


@admin.register(SocialToken)
class SocialTokenAdmin(ReadOnlyAdmin):
    list_display = ["account", "app", "expires_at"]
    exclude = ["token", "token_secret"]


@admin.register(UserSession)
class UserSessionAdmin(ReadOnlyAdmin):
    list_display = ["user", "ip", "created_at", "last_seen_at"]
    exclude = ["session_key"]
