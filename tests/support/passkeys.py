"""A software passkey for tests that do not drive a browser: a real P-256 key that makes
real WebAuthn registrations and assertions (fido2's own structures, signed with
`cryptography`), registered through allauth.mfa like a browser's would be. The browser
tests use Chromium's virtual authenticator instead."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from django.contrib.auth.models import User
from fido2.cose import ES256
from fido2.utils import websafe_encode
from fido2.webauthn import AttestationObject, AttestedCredentialData, AuthenticatorData

ORIGIN = "http://testserver"
RP_ID = "testserver"
FLAGS = AuthenticatorData.FLAG.UP | AuthenticatorData.FLAG.UV


class SoftPasskey:
    def __init__(self, rp_id: str = RP_ID, origin: str = ORIGIN) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.credential_id = os.urandom(32)
        self.rp_id, self.origin = rp_id, origin
        self.counter = 0

    def _auth_data(self, credential: AttestedCredentialData | None = None) -> bytes:
        flags = FLAGS | (AuthenticatorData.FLAG.AT if credential else 0)
        rp_hash = hashlib.sha256(self.rp_id.encode()).digest()
        head = rp_hash + struct.pack(">BI", flags, self.counter)
        return head + (bytes(credential) if credential else b"")

    def registration(self, challenge: str = websafe_encode(b"r" * 32)) -> dict[str, Any]:
        """The browser's registration response (JSON form), attestation "none", over
        `challenge` (base64url: the page's creation options carry it)."""
        cose = ES256.from_cryptography_key(self.key.public_key())
        credential = AttestedCredentialData.create(b"\0" * 16, self.credential_id, cose)
        attestation = AttestationObject.create("none", self._auth_data(credential), {})
        client = {"type": "webauthn.create", "challenge": challenge}
        client |= {"origin": self.origin, "crossOrigin": False}
        return {
            "id": websafe_encode(self.credential_id),
            "rawId": websafe_encode(self.credential_id),
            "type": "public-key",
            "response": {
                "clientDataJSON": websafe_encode(json.dumps(client).encode()),
                "attestationObject": websafe_encode(bytes(attestation)),
            },
            "clientExtensionResults": {"credProps": {"rk": True}},
        }

    def register(self, user: User, name: str = "test key") -> None:
        """Store the passkey as allauth.mfa does when a person adds one."""
        from allauth.mfa.webauthn.internal.auth import WebAuthn

        WebAuthn.add(user, name, self.registration())

    def assertion(self, challenge: bytes) -> dict[str, Any]:
        """navigator.credentials.get's answer (toJSON form) signing `challenge`."""
        self.counter += 1
        client = {"type": "webauthn.get", "challenge": websafe_encode(challenge)}
        client_json = json.dumps(client | {"origin": self.origin, "crossOrigin": False}).encode()
        auth_data = self._auth_data()
        signed = auth_data + hashlib.sha256(client_json).digest()
        signature = self.key.sign(signed, ec.ECDSA(hashes.SHA256()))
        return {
            "id": websafe_encode(self.credential_id),
            "rawId": websafe_encode(self.credential_id),
            "type": "public-key",
            "response": {
                "clientDataJSON": websafe_encode(client_json),
                "authenticatorData": websafe_encode(auth_data),
                "signature": websafe_encode(signature),
            },
            "clientExtensionResults": {},
        }
