"""Verdicts signed with a passkey (step-up): the challenge, the check, the audit record.

A step-up verdict is a WebAuthn assertion over a challenge derived from what is decided:
the approval request, its call, the digest of the arguments the reviewer saw, the verdict
and a one-time nonce (`challenge_for`). The assertion is kept exactly as the authenticator
made it (authenticator data, client data, signature), so anyone holding the passkey's
public key can check, without trusting Harness, that this key signed this verdict on
these bytes: the signature covers the authenticator data and the SHA-256 of the client
data, and the client data holds the challenge.

The checks are fido2's (`Fido2Server.authenticate_complete`, the library allauth.mfa
uses); nothing here parses CBOR or COSE by hand. The registered keys are the passkeys of
allauth.mfa (its Authenticator rows of type webauthn).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fido2.cose import CoseKey
from fido2.server import Fido2Server
from fido2.utils import websafe_decode, websafe_encode
from fido2.webauthn import (
    AttestedCredentialData,
    AuthenticationResponse,
    PublicKeyCredentialRpEntity,
    UserVerificationRequirement,
)

VERSION = "harness-step-up/1"
# The fields of a stored assertion, base64url as WebAuthn's JSON carries them.
SIGNED_FIELDS = ("credential_id", "authenticator_data", "client_data", "signature")

# fido2's reasons, as a reviewer reads them.
_REASONS = {
    "Unknown credential ID.": (
        "This passkey is not one of yours: sign with a passkey registered to your own "
        "account (your page lists them)."
    ),
    "Wrong challenge in response.": (
        "The passkey signed another challenge: this signature was made for another call, "
        "another version of its arguments, another verdict, or was used before. Review "
        "the call again and sign once more."
    ),
    "Invalid signature.": "The passkey's signature does not verify against its public key.",
    "Wrong RP ID hash in response.": (
        "The passkey signed for another site (its relying party is not this Harness)."
    ),
    "Invalid origin in CollectedClientData.": (
        "The passkey was used from another origin than this Harness's address."
    ),
    "Incorrect type in CollectedClientData.": "That is not a sign-in assertion of a passkey.",
    "User Present flag not set.": "The passkey did not confirm that a person was present.",
}


class AssertionRefused(Exception):
    """The assertion does not prove the verdict; the message says why and what to do."""


@dataclass(frozen=True)
class Registered:
    """A passkey registered through allauth.mfa: whose it is, and its public key."""

    user_id: int
    name: str
    credential: AttestedCredentialData


def challenge_for(
    *,
    approval_id: int,
    call_id: str,
    digest: str,
    verdict: str,
    nonce: str,
    effect_digest: str = "",
) -> bytes:
    """The 32-byte challenge a passkey signs for one verdict: SHA-256 of the canonical
    JSON of what is decided. An auditor recomputes it from the audit event.

    A previewed command's request binds the digest of the effect shown as well
    (`effect_digest`); it is in the statement only when there is one, so a verdict signed
    on a call without a preview proves the same statement as before previews."""
    statement: dict[str, Any] = {
        "approval": int(approval_id),
        "call": str(call_id),
        "digest": digest,
        "nonce": nonce,
        "verdict": verdict,
        "version": VERSION,
    }
    if effect_digest:
        statement["effect"] = effect_digest
    text = json.dumps(statement, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).digest()


def request_options(
    *, challenge: bytes, rp_id: str, credentials: Sequence[bytes]
) -> dict[str, Any]:
    """The publicKey options of navigator.credentials.get (WebAuthn's JSON form)."""
    return {
        "challenge": websafe_encode(challenge),
        "rpId": rp_id,
        "allowCredentials": [{"type": "public-key", "id": websafe_encode(c)} for c in credentials],
        "userVerification": "preferred",
        "timeout": 120000,
    }


def parse(response: Any) -> AuthenticationResponse:
    """The browser's PublicKeyCredential (its toJSON form). Raises AssertionRefused."""
    if isinstance(response, str):
        try:
            response = json.loads(response)
        except ValueError:
            response = None
    try:
        if not isinstance(response, Mapping):
            raise TypeError
        return AuthenticationResponse.from_dict(response)
    except (TypeError, ValueError, KeyError):
        raise AssertionRefused(
            "This call needs your passkey: the signed assertion is missing or unreadable. "
            "Approve or deny again and touch your passkey when the browser asks."
        ) from None


def verify(
    response: AuthenticationResponse,
    *,
    challenge: bytes,
    rp_id: str,
    credentials: Sequence[AttestedCredentialData],
    any_origin: bool = False,
) -> AttestedCredentialData:
    """The credential of `credentials` that signed `challenge` for `rp_id`, checked by fido2
    (type, origin unless `any_origin`, challenge, relying party, user presence, signature).
    Raises AssertionRefused naming what failed."""
    server = Fido2Server(
        PublicKeyCredentialRpEntity(name="Harness", id=rp_id),
        verify_origin=(lambda origin: True) if any_origin else None,
    )
    state = {
        "challenge": websafe_encode(challenge),
        "user_verification": UserVerificationRequirement.PREFERRED,
    }
    try:
        return server.authenticate_complete(state, credentials, response)
    except ValueError as error:
        raise AssertionRefused(
            _REASONS.get(str(error), f"The passkey assertion fails: {error}")
        ) from None


def record(
    response: AuthenticationResponse, *, credential: AttestedCredentialData
) -> dict[str, str]:
    """What the vote and the audit event keep of an assertion (base64url), with the
    public key it was checked against (COSE, base64url) so an export verifies offline."""
    assertion = response.response
    return {
        "credential_id": websafe_encode(response.raw_id),
        "authenticator_data": websafe_encode(bytes(assertion.authenticator_data)),
        "client_data": websafe_encode(bytes(assertion.client_data)),
        "signature": websafe_encode(assertion.signature),
        "public_key": websafe_encode(_cose_bytes(credential.public_key)),
    }


def _cose_bytes(key: CoseKey) -> bytes:
    from fido2 import cbor

    return cbor.encode(dict(key))


def as_response(stored: Mapping[str, Any]) -> AuthenticationResponse:
    """A stored assertion back as fido2's AuthenticationResponse (ValueError if unreadable)."""
    try:
        raw_id = websafe_decode(str(stored["credential_id"]))
        return AuthenticationResponse.from_dict(
            {
                "id": websafe_encode(raw_id),
                "rawId": websafe_encode(raw_id),
                "type": "public-key",
                "response": {
                    "authenticatorData": str(stored["authenticator_data"]),
                    "clientDataJSON": str(stored["client_data"]),
                    "signature": str(stored["signature"]),
                },
            }
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"the stored assertion cannot be read ({error})") from None


def recorded_key(stored: Mapping[str, Any]) -> AttestedCredentialData:
    """The public key the event recorded, as a credential fido2 checks against."""
    from fido2 import cbor

    decoded = cbor.decode(websafe_decode(str(stored["public_key"])))
    if not isinstance(decoded, Mapping):
        raise ValueError("the recorded public key is not a COSE key")
    key = CoseKey.parse(decoded)
    raw_id = websafe_decode(str(stored["credential_id"]))
    return AttestedCredentialData.create(b"\0" * 16, raw_id, key)


def problem_in(stored: Any, registered: Mapping[bytes, Registered] | None) -> str | None:
    """Why a stored step-up record does not prove its verdict, or None when it does.

    `stored` holds the decision (approval, call_id, digest, verdict, nonce, rp_id,
    reviewer_id, and effect_digest for a previewed command) and the assertion (SIGNED_FIELDS, public_key). The challenge is
    recomputed from the decision; the signature is checked against the passkey registered
    under its credential id and the key the event recorded (`registered`, from the
    database; rows of other people under the same id, kept from before a known id was
    refused at registration, are not read); when the reviewer's passkey was removed since
    (even if someone registered its id again since, with their own key), or `registered`
    is None (an export checked alone), against the recorded key."""
    if not isinstance(stored, Mapping):
        return "the step-up record is not an object"
    try:
        response = as_response(stored)
        challenge = challenge_for(
            approval_id=int(stored["approval"]),
            call_id=str(stored["call_id"]),
            digest=str(stored["digest"]),
            verdict=str(stored["verdict"]),
            nonce=str(stored["nonce"]),
            effect_digest=str(stored.get("effect_digest") or ""),
        )
        credential = recorded_key(stored)
        rp_id = str(stored["rp_id"])
    except (KeyError, TypeError, ValueError, IndexError) as error:  # (IndexError: bad CBOR)
        return f"the step-up record is incomplete or unreadable ({error})"
    rows = _rows_under(registered, credential.credential_id)
    reviewer = str(stored.get("reviewer_id"))
    same_key = [r for r in rows if r.credential.public_key == credential.public_key]
    if same_key:
        own = [r for r in same_key if str(r.user_id) == reviewer]
        if not own:
            return "the passkey that signed is registered to another person than the reviewer"
        credential = own[0].credential
    elif any(str(r.user_id) == reviewer for r in rows):
        return "the recorded public key is not the key registered under this credential id"
    # (Else no row under the id is the reviewer's: their passkey was removed, and another
    # person may have registered its id since, with their own key, which says nothing of
    # the reviewer's: the recorded key is read, as for a passkey removed.)
    try:
        verify(
            response, challenge=challenge, rp_id=rp_id, credentials=[credential], any_origin=True
        )
    except AssertionRefused as refused:
        return f"the signed assertion does not verify: {refused}"
    return None


class RegisteredKeys(dict[bytes, Registered]):
    """The passkeys registered through allauth.mfa, by credential id (the last row read,
    for the callers that list ids or offer credentials), and every row under each id
    (`rows`): before a known credential id was refused at registration, two people could
    register one id, each with their own key, and a signature is checked against the
    signer's row (credential id and public key), not whichever row was read last."""

    def __init__(self) -> None:
        super().__init__()
        self._rows: dict[bytes, list[Registered]] = {}

    def add(self, registered: Registered) -> None:
        credential_id = registered.credential.credential_id
        self[credential_id] = registered
        self._rows.setdefault(credential_id, []).append(registered)

    def rows(self, credential_id: bytes) -> list[Registered]:
        return list(self._rows.get(credential_id, ()))


def _rows_under(
    registered: Mapping[bytes, Registered] | None, credential_id: bytes
) -> list[Registered]:
    if isinstance(registered, RegisteredKeys):
        return registered.rows(credential_id)
    known = (registered or {}).get(credential_id)
    return [] if known is None else [known]


def registered_keys(user_id: int | None = None) -> RegisteredKeys:
    """The passkeys registered through allauth.mfa (all, or one person's), by credential id
    (and every row under each id: RegisteredKeys). Empty when allauth.mfa is not
    installed."""
    from django.apps import apps

    if not apps.is_installed("allauth.mfa"):
        return RegisteredKeys()
    from allauth.mfa.models import Authenticator

    rows = Authenticator.objects.filter(type=Authenticator.Type.WEBAUTHN)
    if user_id is not None:
        rows = rows.filter(user_id=user_id)
    found = RegisteredKeys()
    for row in rows.order_by("pk"):
        wrapped: Any = row.wrap()
        credential = wrapped.authenticator_data.credential_data
        if credential is not None:
            found.add(Registered(row.user_id, wrapped.name, credential))
    return found
