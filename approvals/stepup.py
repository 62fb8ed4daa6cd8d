"""Step-up: a verdict a rule asks a passkey for is signed over what is decided.

`begin` gives the browser a challenge for one verdict on one request (the request, its
call, the digest shown, the verdict, a one-time nonce and, for a previewed command, the
digest of the effect shown: audit.assertions.challenge_for);
the page keeps the nonce in the person's session. `check`, run by services.decide inside
the deciding transaction (the request locked, its digest already compared), verifies the
assertion against the reviewer's own passkeys (allauth.mfa) and records it
(SignedVerdict); the audit event of the decision carries the same record.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser

from audit import assertions

from .models import ApprovalRequest, SignedVerdict


class StepUpRefused(Exception):
    """No signed verdict: the message says why and what to do next; `status` for a view
    (400: nothing signed or unreadable; 403: a signature that does not prove the verdict)."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Signed:
    """What the browser sent for a step-up verdict: the assertion (PublicKeyCredential's
    JSON), the nonce `begin` gave, and the relying party (the host the page was on)."""

    response: Any
    nonce: str
    rp_id: str
    # The challenge was issued more than CHALLENGE_SECONDS before the decision came.
    stale: bool = False


# How long a challenge `begin` gives may wait for its signed decision: the browser's own
# limit (request_options' timeout, 120 s) and time to send the form. An assertion made
# for an older challenge (signed then kept, or signed late) decides nothing, so a
# signature's time and its decision's are at most this far apart.
CHALLENGE_SECONDS = 300


def begin(
    *, approval: ApprovalRequest, user: AbstractBaseUser, verdict: str, rp_id: str
) -> tuple[str, dict[str, Any]]:
    """A nonce and the publicKey options for `user` to sign `verdict` on `approval`.
    Raises StepUpRefused when the verdict needs no key or `user` has no passkey."""
    if not approval.needs_key(verdict):
        raise StepUpRefused(f"This call's {verdict} needs no passkey.")
    keys = assertions.registered_keys(user.pk)
    if not keys:
        raise StepUpRefused(
            "This call must be signed with a passkey, and you have none: add one on your "
            "page (your name, top right: Add a passkey), then come back to this call."
        )
    nonce = secrets.token_urlsafe(24)
    challenge = assertions.challenge_for(
        approval_id=approval.pk,
        call_id=str(approval.call_id),
        digest=approval.call.digest,
        verdict=verdict,
        nonce=nonce,
        effect_digest=approval.effect_digest,
    )
    options = assertions.request_options(challenge=challenge, rp_id=rp_id, credentials=list(keys))
    return nonce, options


def check(
    *,
    approval: ApprovalRequest,
    user: AbstractBaseUser,
    verdict: str,
    digest: str,
    signed: Signed | None,
) -> dict[str, Any]:
    """Verify and keep `user`'s signed `verdict` on `approval` (whose row the caller has
    locked, and whose digest it has compared with `digest`). Returns the record for the
    audit event. Raises StepUpRefused: no assertion, not one of `user`'s passkeys, another
    challenge (another call, digest, verdict or nonce: a replay), a bad signature."""
    if signed is not None and not signed.nonce:
        raise StepUpRefused(
            "No challenge of yours is waiting for this signature: it was used already or "
            "made for another page (a replay). Choose again and touch your passkey."
        )
    if signed is None:
        raise StepUpRefused(
            "This call must be signed with your passkey (a step-up rule). Open it in the "
            "queue, choose again and touch your passkey when the browser asks.",
            400,
        )
    if signed.stale:
        raise StepUpRefused(
            f"This signature's challenge is more than {CHALLENGE_SECONDS // 60} minutes "
            "old: a passkey signs a decision only just before it is taken. Review the call "
            "again, choose again and touch your passkey."
        )
    response = _parse(signed.response)
    challenge = assertions.challenge_for(
        approval_id=approval.pk,
        call_id=str(approval.call_id),
        digest=digest,
        verdict=verdict,
        nonce=signed.nonce,
        effect_digest=approval.effect_digest,
    )
    keys = assertions.registered_keys(user.pk)
    try:
        credential = assertions.verify(
            response,
            challenge=challenge,
            rp_id=signed.rp_id,
            credentials=[k.credential for k in keys.values()],
            any_origin=getattr(settings, "MFA_WEBAUTHN_ALLOW_INSECURE_ORIGIN", False),
        )
    except assertions.AssertionRefused as refused:
        raise StepUpRefused(str(refused)) from None
    if SignedVerdict.objects.filter(nonce=signed.nonce).exists():
        raise StepUpRefused("This signature was used before; sign again.")
    count = response.response.authenticator_data.counter
    kept = assertions.record(response, credential=credential)
    _check_counter(kept["credential_id"], kept["public_key"], count)
    SignedVerdict.objects.create(
        approval=approval,
        voter=user,  # type: ignore[misc]
        verdict=verdict,
        digest=digest,
        nonce=signed.nonce,
        rp_id=signed.rp_id,
        public_key=kept["public_key"],
        sign_count=count,
        **{k: kept[k] for k in assertions.SIGNED_FIELDS},
    )
    name = keys[credential.credential_id].name
    return {
        "approval": approval.pk,
        "call_id": str(approval.call_id),
        "digest": digest,
        "verdict": verdict,
        "nonce": signed.nonce,
        "rp_id": signed.rp_id,
        "reviewer_id": user.pk,
        "passkey": name,
        **({"effect_digest": approval.effect_digest} if approval.effect_digest else {}),
        **kept,
    }


def _check_counter(credential_id: str, public_key: str, count: int) -> None:
    """A key that counts its signatures must count up: a counter at or below one this
    passkey signed a verdict with before means two copies of the key (a clone). "This
    passkey" is its credential id *and* its public key: a credential id is chosen by the
    authenticator and public (the audit log carries it), and allauth.mfa registers the same
    id to two people, so someone else's key registered under your passkey's id, signing
    with a high counter, must not make your own signatures look cloned. A clone has the
    same public key."""
    if count == 0:
        return  # a passkey that keeps no counter (synced passkeys)
    last = (
        SignedVerdict.objects.filter(credential_id=credential_id, public_key=public_key)
        .order_by("-sign_count")
        .values_list("sign_count", flat=True)
        .first()
    )
    if last is not None and count <= last:
        raise StepUpRefused(
            f"This passkey's signature counter went back ({count}, after {last}): the key "
            "may have been copied. Nothing was decided; ask an admin to check the passkey."
        )


def _parse(response: Any) -> Any:
    try:
        return assertions.parse(response)
    except assertions.AssertionRefused as refused:
        raise StepUpRefused(str(refused), 400) from None


def kept_problems() -> list[str]:
    """One line per kept signed verdict (SignedVerdict) whose assertion does not prove
    it, checked like the audit event's copy (audit.assertions.problem_in): verify_audit
    reads the votes too, which the hash chain does not cover."""
    keys = assertions.registered_keys()
    problems = []
    for row in SignedVerdict.objects.select_related("approval").order_by("pk").iterator():
        stored = {
            "approval": row.approval_id,
            "call_id": str(row.approval.call_id),
            "digest": row.digest,
            "verdict": row.verdict,
            "nonce": row.nonce,
            "rp_id": row.rp_id,
            "reviewer_id": row.voter_id,
            "public_key": row.public_key,
            "effect_digest": row.approval.effect_digest,
            **{k: getattr(row, k) for k in assertions.SIGNED_FIELDS},
        }
        what = assertions.problem_in(stored, keys)
        if what is not None:
            problems.append(f"signed vote {row.pk} (call {row.approval.call_id}): {what}")
    return problems
