"""allauth.mfa's passkeys: "Sign in with a passkey", closed while single sign-on is the only
way in; and adding one, refused for a credential id registered already.

With HARNESS_SSO_ONLY people are who the identity provider says, and their roles and
teams follow its groups on every sign-in (identity.groups): a passwordless passkey
sign-in would go around it (a person the provider disabled, or took out of the admins'
group, signing in with the roles of their last SSO sign-in). A break-glass account signs
in with its password (audited as break-glass, the admins told; its passkey is asked for
after, as a second factor). Passkeys still sign in people on their own without
HARNESS_SSO_ONLY, and stay second factors and step-up keys either way.

A credential id names one passkey everywhere (approvals.stepup's clone check and
verify_audit look keys up by it), but it is chosen by the authenticator and is public
(the audit log carries it): allauth.mfa registered someone else's id to a second person,
whose own key then made the first person's signatures look cloned and their signed
records fail verify_audit. WebAuthn's registration ceremony says to refuse a credential
id already known (Web Authentication Level 2, 7.1 step 22); PasskeyAddForm does.

A passkey's answer that cannot be read (a field missing or of the wrong kind) is refused
as such, on every form that takes one: allauth.mfa reads some of those with no check and
answered a 500, to anyone on the sign-in page.
"""

from __future__ import annotations

from typing import Any

from allauth.mfa.webauthn.forms import (
    AddWebAuthnForm,
    AuthenticateWebAuthnForm,
    LoginWebAuthnForm,
    ReauthenticateWebAuthnForm,
)
from django.conf import settings
from django.core.exceptions import ValidationError
from fido2.webauthn import AuthenticationResponse, RegistrationResponse

from audit.assertions import registered_keys

PASSKEY_SIGN_IN_OFF = (
    "Passkey sign-in is off: sign in with your organization's identity provider. "
    "(Break-glass accounts: use the username and password.)"
)


UNREADABLE = (
    "Your passkey's answer could not be read. Try again, and touch your passkey when the "
    "browser asks."
)
# What fido2 raises for a credential missing a field, or holding one of the wrong kind.
_MALFORMED = (TypeError, ValueError, KeyError, AttributeError, IndexError)


def _read_assertion(credential: Any) -> None:
    """ValidationError(UNREADABLE) unless `credential` reads as a WebAuthn assertion."""
    try:
        AuthenticationResponse.from_dict(credential)
    except _MALFORMED:
        raise ValidationError(UNREADABLE) from None


class PasskeyAssertionForm(AuthenticateWebAuthnForm):  # type: ignore[misc]  # allauth is untyped
    """settings.MFA_FORMS["authenticate_webauthn"]: the passkey asked as a second factor."""

    def clean_credential(self) -> Any:
        _read_assertion(self.cleaned_data.get("credential"))
        return super().clean_credential()


class PasskeyReauthenticateForm(ReauthenticateWebAuthnForm):  # type: ignore[misc]
    """settings.MFA_FORMS["reauthenticate_webauthn"]: confirming who one is again."""

    def clean_credential(self) -> Any:
        _read_assertion(self.cleaned_data.get("credential"))
        return super().clean_credential()


class PasskeySignInForm(LoginWebAuthnForm):  # type: ignore[misc]  # allauth is untyped
    """settings.MFA_FORMS["login_webauthn"]."""

    def clean_credential(self) -> Any:
        if settings.HARNESS_SSO_ONLY:
            raise ValidationError(PASSKEY_SIGN_IN_OFF)
        _read_assertion(self.cleaned_data.get("credential"))
        return super().clean_credential()


ALREADY_REGISTERED = (
    "This passkey is registered already (to this account or another): a passkey belongs "
    "to one person. Use another key, or remove it from the other account first."
)


class PasskeyAddForm(AddWebAuthnForm):  # type: ignore[misc]  # allauth is untyped
    """settings.MFA_FORMS["add_webauthn"]: a credential id registered already is refused,
    then allauth checks the registration. (Before allauth's check, which uses up the
    ceremony's state: allauth's view validates a second form to show the page again.)"""

    def clean(self) -> Any:
        credential = self.cleaned_data.get("credential")
        if credential:
            try:
                response = RegistrationResponse.from_dict(credential)
                data = response.response.attestation_object.auth_data.credential_data
            except _MALFORMED:
                raise ValidationError(UNREADABLE) from None
            if data is not None and data.credential_id in registered_keys():
                raise ValidationError(ALREADY_REGISTERED)
        return super().clean()
