"""Signed one-tap links: one recipient, one call, one verdict, used once.

A link carries, signed with SECRET_KEY (django.core.signing, its own salt): the request
and call ids, the digest of the arguments it was made for, the recipient, the verdict
(approve or deny), the request's expiry and a random nonce. Opening it (GET) only shows
the call; the POST that confirms decides, through `services.decide` like the queue, and
records the nonce (UsedLink, unique) in the same transaction: a link decides at most
once. A link whose signature does not verify, whose call changed or is decided, whose
request expired, whose nonce was used, or whose recipient was deactivated or lost the
reviewer role in the agent's team (checked again when the POST decides), decides
nothing and says which.

With HARNESS_LINKS_REQUIRE_LOGIN (the default) the person must also be signed in as the
recipient. Without it the link alone stands for the recipient, for that one decision:
whoever holds it can decide (see docs/notifications.md). Either way a recipient whom
HARNESS_MFA_REQUIRED names and who has no second factor yet decides nothing by a link
(signed in, they would reach no page but the set-up one: identity.mfa); a confirm refused
so is audited (approval.second_factor_missing).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core import signing
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from audit import kinds
from audit.roles import REVIEWER, deactivated_since, lacks_required_factor, reach
from audit.services import record_event
from dispatcher.models import Status
from teams.scope import ask_teams

from . import services
from .models import ApprovalRequest, UsedLink

SALT = "harness.approvals.one-tap-link"
VERDICTS = ("approve", "deny")
STEP_UP_MESSAGE = (
    "This call must be signed with your passkey, so a link cannot decide it: open the "
    "call's page, choose there and touch your passkey when the browser asks."
)


class LinkRefused(Exception):
    """The link cannot decide; the message says why and what to do; `status` for a view."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class SecondFactorMissing(LinkRefused):
    """The recipient must have a second factor (HARNESS_MFA_REQUIRED) and has none."""

    def __init__(self, recipient: User) -> None:
        super().__init__(
            f"{recipient.get_username()} must set up a second factor (an authenticator app "
            "or a passkey) before deciding: this organization requires one of them. Sign "
            f"in, set one up at {reverse('identity_mfa_setup')}, then use this link or the "
            "approval queue.",
            403,
        )


@dataclass(frozen=True)
class Claim:
    """What a verified link says, with the request it names."""

    approval: ApprovalRequest
    recipient: User
    verdict: str
    digest: str
    nonce: str


def make_token(approval: ApprovalRequest, recipient: User, verdict: str) -> str:
    if verdict not in VERDICTS:
        raise ValueError(f"Unknown verdict '{verdict}'.")
    payload = {
        "a": approval.pk,
        "c": str(approval.call_id),
        "d": approval.digest,
        "u": recipient.pk,
        "v": verdict,
        "e": int(approval.expires_at.timestamp()),
        "t": time.time(),  # issued: a deactivation after it voids the link for good
        "n": secrets.token_hex(16),
    }
    return signing.dumps(payload, salt=SALT, compress=True)


def make_url(approval: ApprovalRequest, recipient: User, verdict: str) -> str:
    """The absolute link (HARNESS_PUBLIC_URL) for `recipient` to `verdict` this request."""
    path = reverse("approvals:link", args=[make_token(approval, recipient, verdict)])
    return settings.HARNESS_PUBLIC_URL.rstrip("/") + path


def links_for(approval: ApprovalRequest, recipient: User) -> dict[str, str]:
    """The recipient's link per verdict; a verdict a step-up rule asks a passkey for gets
    the call's page instead (it is signed there, never decided by a link).

    A recipient whom HARNESS_MFA_REQUIRED names and who has no second factor yet gets no
    link that decides (`use` would refuse it: SecondFactorMissing): only the call's page
    ("open") and the set-up page ("second_factor_setup"), which a message says to use
    first. The notifications send whatever this returns."""
    base = settings.HARNESS_PUBLIC_URL.rstrip("/")
    page = base + reverse("approvals:detail", args=[approval.pk])
    if lacks_required_factor(recipient):
        return {"open": page, "second_factor_setup": base + reverse("identity_mfa_setup")}
    return {
        verdict: page if approval.needs_key(verdict) else make_url(approval, recipient, verdict)
        for verdict in VERDICTS
    }


def read(token: str) -> Claim:
    """Verify a link and what it names. Raises LinkRefused saying what is wrong."""
    try:
        payload: Any = signing.loads(token, salt=SALT)
    except signing.BadSignature:
        raise LinkRefused(
            "This link is not valid: it was altered or cut short. Open the call from the "
            "approval queue instead.",
            400,
        ) from None
    try:
        approval_id, call_id, digest = int(payload["a"]), str(payload["c"]), str(payload["d"])
        recipient_id, verdict, nonce = int(payload["u"]), str(payload["v"]), str(payload["n"])
        expires = float(payload["e"])
        issued = float(payload.get("t", 0))  # links made before "t" existed: issued at 0
    except (KeyError, TypeError, ValueError):
        raise LinkRefused("This link is not valid. Open the call from the queue.", 400) from None
    approval = (
        ApprovalRequest.objects.select_related("call__session__agent", "decided_by")
        .filter(pk=approval_id)
        .first()
    )
    recipient = User.objects.filter(pk=recipient_id).first()
    if approval is None or str(approval.call_id) != call_id or recipient is None:
        raise LinkRefused("This link names a call or a person that no longer exists.", 404)
    if not recipient.is_active:
        raise LinkRefused(
            f"{recipient.get_username()}'s account is deactivated: this link decides nothing. "
            "An active reviewer can decide the call from the queue.",
            403,
        )
    if deactivated_since(recipient, issued):
        raise LinkRefused(
            f"{recipient.get_username()}'s account was deactivated after this link was sent: "
            "it decides nothing. An active reviewer can decide the call from the queue.",
            403,
        )
    if verdict not in VERDICTS:
        raise LinkRefused("This link is not valid. Open the call from the queue.", 400)
    # Before anything of the call is said: a link of someone who does not (or no longer)
    # review the agent's team decides and shows nothing (teams.scope).
    if not reach(recipient, REVIEWER).covers_any(*ask_teams(approval)):
        raise LinkRefused(
            f"{recipient.get_username()} does not review this agent's team: this link "
            "decides nothing.",
            403,
        )
    claim = Claim(approval, recipient, verdict, digest, nonce)
    if UsedLink.objects.filter(nonce=nonce).exists():
        raise LinkRefused("This link was already used; a link decides only once.", 409)
    if approval.call.status != Status.PENDING_APPROVAL:
        raise LinkRefused(services.already_decided(approval), 409)
    if timezone.now().timestamp() >= min(expires, approval.expires_at.timestamp()):
        raise LinkRefused("This link has expired with the approval it was made for.", 410)
    if digest != approval.call.digest:
        raise LinkRefused("The call's arguments are not the ones this link was made for.", 409)
    return claim


def person_for(claim: Claim, user: Any, *, confirming: bool = False) -> User:
    """Who decides through this link: the signed-in recipient, or with
    HARNESS_LINKS_REQUIRE_LOGIN off, the recipient the link names (whose role in the
    agent's team `read` checked). Raises LinkRefused (SecondFactorMissing when
    HARNESS_MFA_REQUIRED asks the recipient for a second factor they do not have yet,
    audited when `confirming`: a POST that would decide)."""
    if user is not None and user.is_authenticated:
        if user.pk != claim.recipient.pk:
            raise LinkRefused(
                f"This link was made for {claim.recipient.get_username()}; you are signed in "
                f"as {user.get_username()}. Open the call from your own queue instead.",
                403,
            )
    elif settings.HARNESS_LINKS_REQUIRE_LOGIN:
        raise LinkRefused("Sign in to use this link.", 401)
    # Signed in, such a person reaches no page but the set-up one (identity.mfa); the link
    # alone must not decide for them either.
    if lacks_required_factor(claim.recipient):
        refused = SecondFactorMissing(claim.recipient)
        if confirming:
            _audit_second_factor_missing(claim, refused)
        raise refused
    return claim.recipient


def use(
    *, token: str, user: Any, digest: str, comment: str = "", effect_digest: str = ""
) -> ApprovalRequest:
    """Decide with a link, once: `digest` (and for a previewed command `effect_digest`)
    the one the confirm page showed. Raises
    LinkRefused (with services.DecisionRefused's answer when the decision is refused)."""
    claim = read(token)
    person = person_for(claim, user, confirming=True)
    if claim.approval.needs_key(claim.verdict):
        raise LinkRefused(STEP_UP_MESSAGE, 400)
    if digest != claim.digest:
        raise LinkRefused("The arguments you confirmed are not the ones this link is for.", 409)
    with transaction.atomic():
        try:
            with transaction.atomic():
                used = UsedLink.objects.create(
                    nonce=claim.nonce,
                    approval=claim.approval,
                    recipient=person,
                    verdict=claim.verdict,
                )
        except IntegrityError:
            message = "This link was already used; a link decides only once."
            raise LinkRefused(message, 409) from None
        try:
            return services.decide(
                approval_id=claim.approval.pk,
                user=person,
                approve=claim.verdict == "approve",
                digest=digest,
                feedback=comment,
                via="link",
                effect_digest=effect_digest,
            )
        except services.DecisionRefused as refused:
            # Nothing was decided: the link stays unused, and what the refusal recorded
            # (an effect digest mismatch's audit event, as the queue's) is committed, not
            # rolled back with it.
            used.delete()
            refusal = refused
    raise LinkRefused(str(refusal), refusal.status)


def _audit_second_factor_missing(claim: Claim, refused: SecondFactorMissing) -> None:
    """approval.second_factor_missing: a confirm refused for the recipient's missing second
    factor, committed on its own (nothing else changed). Opening the link (GET) is refused
    the same way but not recorded: a mail scanner or a link preview fetches it unasked."""
    approval = claim.approval
    with transaction.atomic():
        record_event(
            kind=kinds.APPROVAL_SECOND_FACTOR_MISSING,
            actor=f"user:{claim.recipient.get_username()}",
            subject=f"call:{approval.call_id}",
            session_id=approval.call.session_id,
            payload={
                "call_id": str(approval.call_id),
                "verdict": claim.verdict,
                "via": "link",
                "reason": str(refused),
            },
        )
