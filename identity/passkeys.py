"""allauth.mfa's "Sign in with a passkey", closed while single sign-on is the only way in.

With HARNESS_SSO_ONLY people are who the identity provider says, and their roles and
teams follow its groups on every sign-in (identity.groups): a passwordless passkey
sign-in would go around it (a person the provider disabled, or took out of the admins'
group, signing in with the roles of their last SSO sign-in). A break-glass account signs
in with its password (audited as break-glass, the admins told; its passkey is asked for
after, as a second factor). Passkeys still sign in people on their own without
HARNESS_SSO_ONLY, and stay second factors and step-up keys either way.
"""

from __future__ import annotations

from typing import Any

from allauth.mfa.webauthn.forms import LoginWebAuthnForm
from django.conf import settings
from django.core.exceptions import ValidationError

PASSKEY_SIGN_IN_OFF = (
    "Passkey sign-in is off: sign in with your organization's identity provider. "
    "(Break-glass accounts: use the username and password.)"
)


class PasskeySignInForm(LoginWebAuthnForm):  # type: ignore[misc]  # allauth is untyped
    """settings.MFA_FORMS["login_webauthn"]."""

    def clean_credential(self) -> Any:
        if settings.HARNESS_SSO_ONLY:
            raise ValidationError(PASSKEY_SIGN_IN_OFF)
        return super().clean_credential()
