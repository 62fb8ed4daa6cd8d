"""A reviewer's request: one per call that asked, and the decision that closed it."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from dispatcher.models import Status, ToolCall


class Decision(models.TextChoices):
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    # A reviewer changed the arguments: the call ended, a linked new call replaced it.
    EDITED = "edited"


class ApprovalRequestQuerySet(models.QuerySet["ApprovalRequest"]):
    def pending(self) -> ApprovalRequestQuerySet:
        return self.filter(call__status=Status.PENDING_APPROVAL)

    def due(self, now: object) -> ApprovalRequestQuerySet:
        return self.pending().filter(expires_at__lt=now)


class ApprovalRequest(models.Model):
    call = models.OneToOneField(ToolCall, on_delete=models.PROTECT, related_name="approval")
    reason = models.TextField(help_text="Why the call asks: the mode or rule that said ask.")
    asked_by = models.CharField(max_length=200)
    presentation = models.JSONField(default=dict, help_text="The tool's present_call output.")
    digest = models.CharField(max_length=64, help_text="Digest of the logged arguments.")
    # A previewed command: the digest of the effect the reviewer is shown (issue 36). An
    # approval counts only with this digest too; "" when nothing was previewed. (A
    # database default: a process of the release before it still inserts requests.)
    effect_digest = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    # Quorum: how many distinct reviewers must approve (of `group`, when set).
    approvals_required = models.PositiveSmallIntegerField(default=1)
    group = models.CharField(max_length=150, blank=True)
    # Several groups as several counts: [{"group": ..., "count": ...}] ("1 of
    # payments-oncall and 1 of security"); `group` is then "" and `approvals_required`
    # their sum, or more: the rest are places any eligible reviewer may fill (`anyone`:
    # rules of several layers combined, "1 of sre" and "2 approvals").
    groups = models.JSONField(default=list, blank=True)
    # Escalation (teams.Team.escalation_after): when no one decided in time, the ask is
    # offered to the next tier as well, the team `escalated_to` (None with `escalated_at`
    # set: the organization's reviewers). Within that team's reach from then on.
    escalated_at = models.DateTimeField(null=True, blank=True)
    escalated_to = models.ForeignKey(
        "teams.Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Step-up: the verdicts ("approve", "deny") a reviewer must sign with a passkey.
    step_up = models.JSONField(default=list, blank=True)

    decision = models.CharField(max_length=16, choices=Decision.choices, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    feedback = models.TextField(blank=True)
    digest_seen = models.CharField(max_length=64, blank=True)

    objects = ApprovalRequestQuerySet.as_manager()

    class Meta:
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"approval for {self.call}"

    @property
    def is_quorum(self) -> bool:
        return self.approvals_required > 1 or bool(self.group) or bool(self.groups)

    def counts(self) -> dict[str, int]:
        """{group: count} of a request that needs several groups (empty otherwise)."""
        return {str(g["group"]): int(g["count"]) for g in self.groups or []}

    @property
    def anyone(self) -> int:
        """How many of a groups request's approvals any eligible reviewer may give (in no
        group's place; 0 for every other request)."""
        if not self.groups:
            return 0
        return max(0, self.approvals_required - sum(self.counts().values()))

    # Not stored: set for one viewer (approvals.queries.mark_escalated_only) when they see
    # the ask only through its escalation, and may not allow it for the agent's session.
    escalated_only = False

    def needs_key(self, verdict: str) -> bool:
        """True when `verdict` ("approve" or "deny") must be signed with a passkey."""
        return verdict in (self.step_up or [])

    def approvers(self) -> list[str]:
        """Usernames of the approvals counted so far, in order (reads `votes`)."""
        return [
            v.voter.get_username() for v in self.votes.all() if v.verdict == Vote.Verdict.APPROVE
        ]

    def group_progress(self) -> list[tuple[str, int, list[str]]]:
        """(group, count, usernames counted towards it) per group of a several-groups
        request, in the rule's order (reads `votes`: each vote counts towards the one group
        the decision assigned it, Vote.group)."""
        votes = [v for v in self.votes.all() if v.verdict == Vote.Verdict.APPROVE]
        return [
            (group, count, [v.voter.get_username() for v in votes if v.group == group])
            for group, count in self.counts().items()
        ]

    def anyone_progress(self) -> list[str]:
        """Usernames of the votes counted in the places anyone may fill (Vote.group ANYONE)."""
        return [
            v.voter.get_username()
            for v in self.votes.all()
            if v.verdict == Vote.Verdict.APPROVE and v.group == ANYONE
        ]

    def progress(self) -> str:
        """ "1 of 2: alice" (empty for a request that needs one approval from anyone);
        with places anyone may fill, "1 of 2 approvals: bob; 1 from sre still needed"."""
        if not self.is_quorum:
            return ""
        if self.anyone:
            return self._mixed_progress()
        if self.groups:
            return "; ".join(
                f"{group} {len(names)} of {count}" + (f": {', '.join(names)}" if names else "")
                for group, count, names in self.group_progress()
            )
        names = self.approvers()
        text = f"{len(names)} of {self.approvals_required}"
        return f"{text}: {', '.join(names)}" if names else text

    def _mixed_progress(self) -> str:
        """Groups' places and places anyone may fill: the count in all, who counts (and
        for which group), then what is still needed of each group and of anyone."""
        groups = self.group_progress()
        anyone = self.anyone_progress()
        names = [f"{n} ({g})" for g, _, counted in groups for n in counted] + anyone
        counted = len(names)
        text = f"{counted} of {self.approvals_required} approvals"
        if names:
            text += ": " + ", ".join(names)
        needed = [f"{count - len(c)} from {g}" for g, count, c in groups if len(c) < count]
        if len(anyone) < self.anyone:
            needed.append(f"{self.anyone - len(anyone)} more from any reviewer")
        if needed:
            text += "; " + " and ".join(needed) + " still needed"
        return text


# Vote.group of a vote counted in a place any eligible reviewer may fill (never a group's
# name: a quorum's groups match dispatcher.policy.profiles.GROUP_NAME).
ANYONE = "*"


class Vote(models.Model):
    """One reviewer's approval towards a quorum, bound to the digest they saw. A person
    counts once per request (the constraint); a deny is not a vote: it ends the call."""

    class Verdict(models.TextChoices):
        APPROVE = "approve"

    approval = models.ForeignKey(ApprovalRequest, on_delete=models.PROTECT, related_name="votes")
    voter = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    verdict = models.CharField(max_length=16, choices=Verdict.choices, default=Verdict.APPROVE)
    digest_seen = models.CharField(max_length=64)
    comment = models.TextField(blank=True)
    # How the vote came: the queue, a one-tap link, or a reviewer's edit of the call.
    via = models.CharField(max_length=16, default="queue")
    # A several-groups request: the one group this vote counts towards (the decision
    # assigns votes to groups so that as many counts as possible are met); ANYONE for a
    # place any eligible reviewer may fill, "" for a vote that counts nowhere.
    group = models.CharField(max_length=150, blank=True, default="", db_default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]
        constraints = [
            models.UniqueConstraint(fields=["approval", "voter"], name="vote_once_per_reviewer")
        ]

    def __str__(self) -> str:
        return f"{self.voter} {self.verdict} {self.approval_id}"


class SignedVerdict(models.Model):
    """A reviewer's verdict signed with a passkey (step-up): the WebAuthn assertion exactly
    as the authenticator made it, over a challenge derived from the request, the call's
    digest, the verdict and a one-time nonce (audit.assertions.challenge_for). One per
    signature (its nonce): a reviewer whose signed vote was discarded (they left the team
    or were deactivated, then came back) signs again, and both are kept; what counts is
    the Vote. The audit event of the decision carries the same fields, and verify_audit
    checks them against the passkey's registered public key."""

    approval = models.ForeignKey(ApprovalRequest, on_delete=models.PROTECT, related_name="+")
    voter = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    verdict = models.CharField(max_length=16)
    digest = models.CharField(max_length=64)
    nonce = models.CharField(max_length=64, unique=True)
    rp_id = models.CharField(max_length=253)
    # base64url, as WebAuthn's JSON carries them
    credential_id = models.TextField()
    authenticator_data = models.TextField()
    client_data = models.TextField()
    signature = models.TextField()
    # The COSE public key it was checked against, as registered then (base64url).
    public_key = models.TextField()
    # The authenticator's signature counter (0: a passkey that keeps none, as synced ones).
    sign_count = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]

    def __str__(self) -> str:
        return f"{self.voter} signed {self.verdict} on {self.approval_id}"


class UsedLink(models.Model):
    """A one-tap link that decided: its nonce, so the same link never decides twice."""

    nonce = models.CharField(max_length=32, unique=True)
    approval = models.ForeignKey(ApprovalRequest, on_delete=models.PROTECT, related_name="+")
    recipient = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    verdict = models.CharField(max_length=16)
    used_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"link {self.nonce} ({self.verdict})"


# The notification models belong to this app (approvals.notifications.models).
from .notifications.models import Channel, Delivery, PushSubscription  # noqa: E402

__all__ = [
    "ApprovalRequest",
    "Channel",
    "Decision",
    "Delivery",
    "PushSubscription",
    "SignedVerdict",
    "UsedLink",
    "Vote",
]
