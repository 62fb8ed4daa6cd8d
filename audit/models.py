"""The append-only audit log: one hash chain per session (or per global stream)."""

from __future__ import annotations

from typing import Any

from django.db import models


class AppendOnlyError(Exception):
    """Raised on any attempt to change or remove an audit event."""


class AuditEventQuerySet(models.QuerySet["AuditEvent"]):
    def update(self, **kwargs: Any) -> int:
        raise AppendOnlyError("Audit events are append-only; they cannot be updated.")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("Audit events are append-only; they cannot be deleted.")

    def for_chain(self, chain: str) -> AuditEventQuerySet:
        return self.filter(chain=chain).order_by("seq")


GLOBAL_CHAIN = "global"


class AuditChainQuerySet(models.QuerySet["AuditChain"]):
    def sessions(self) -> AuditChainQuerySet:
        return self.filter(session_id__isnull=False)


class AuditEvent(models.Model):
    id = models.BigAutoField(primary_key=True)
    # The chain this event belongs to: the session id, or GLOBAL_CHAIN for events with
    # no session (agent created, mode changed ...).
    chain = models.CharField(max_length=64)
    session_id = models.UUIDField(null=True, blank=True, db_index=True)
    seq = models.PositiveBigIntegerField()
    kind = models.CharField(max_length=64)
    actor = models.CharField(max_length=200)
    subject = models.CharField(max_length=200, blank=True)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["chain", "seq"], name="auditevent_unique_chain_seq")
        ]
        indexes = [
            models.Index(fields=["kind"]),
            models.Index(fields=["subject"]),
            models.Index(fields=["created_at"], name="auditevent_created_at"),
        ]

    def __str__(self) -> str:
        return f"{self.chain}#{self.seq} {self.kind}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnlyError("Audit events are append-only; they cannot be updated.")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("Audit events are append-only; they cannot be deleted.")


class AuditChain(models.Model):
    """The head of one chain (its last seq and hash) and, for a session, its summary.

    Derived from the events by `record_event` in the same transaction, so it is never
    ahead of or behind the log. The head lets the verifier notice a chain whose last
    events were removed, and its signature a head recomputed without the audit key; the
    summary makes the session list fast without reading events.
    """

    chain = models.CharField(max_length=64, primary_key=True)
    session_id = models.UUIDField(null=True, blank=True)
    agent = models.CharField(max_length=200, blank=True)
    owner = models.CharField(max_length=150, blank=True)
    title = models.CharField(max_length=200, blank=True)
    mode = models.CharField(max_length=16, blank=True)
    first_at = models.DateTimeField()
    last_at = models.DateTimeField()
    last_seq = models.PositiveBigIntegerField()
    last_hash = models.CharField(max_length=64)
    last_event_id = models.BigIntegerField()
    # audit.signing.sign_head(chain, last_seq, last_hash), with a key the database never
    # holds: a head rewritten without the key no longer verifies.
    head_signature = models.CharField(max_length=120, blank=True, default="")
    # Tools called, space-separated with a leading and trailing space: " read_file run_command ".
    tools = models.TextField(blank=True, default="")
    calls = models.PositiveIntegerField(default=0)
    allowed = models.PositiveIntegerField(default=0)
    asked = models.PositiveIntegerField(default=0)
    approved = models.PositiveIntegerField(default=0)
    denied = models.PositiveIntegerField(default=0)
    rejected = models.PositiveIntegerField(default=0)
    cancelled = models.PositiveIntegerField(default=0)
    expired = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    timed_out = models.PositiveIntegerField(default=0)
    outcome_unknown = models.PositiveIntegerField(default=0)

    objects = AuditChainQuerySet.as_manager()

    class Meta:
        ordering = ["-last_at"]
        indexes = [
            models.Index(fields=["-last_at"], name="auditchain_last_at"),
            models.Index(fields=["agent", "-last_at"], name="auditchain_agent_last_at"),
            models.Index(fields=["owner", "-last_at"], name="auditchain_owner_last_at"),
            models.Index(fields=["first_at"], name="auditchain_first_at"),
        ]

    def __str__(self) -> str:
        return f"{self.chain} (seq {self.last_seq})"


class CheckpointRun(models.Model):
    """The last checkpoint run to each destination file: when it ran, whether it
    succeeded, what it wrote, and the newest checkpoint in the file after it.

    Written only by `audit.checkpoints.write` (beat's job and `audit_checkpoint`), one
    row per file, replaced by each run; the overview reads it. A status, not evidence:
    the evidence is the file itself.
    """

    path = models.CharField(max_length=500, primary_key=True)
    url = models.CharField(max_length=200, blank=True, default="")  # scheme://host only
    finished_at = models.DateTimeField()
    succeeded = models.BooleanField()
    written = models.PositiveIntegerField(default=0)
    refused = models.PositiveIntegerField(default=0)
    error = models.CharField(max_length=500, blank=True, default="")
    # The time of the newest checkpoint line in the file (None: none written yet).
    last_checkpoint_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.path} at {self.finished_at} ({'ok' if self.succeeded else 'failed'})"
