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
        indexes = [models.Index(fields=["kind"]), models.Index(fields=["subject"])]

    def __str__(self) -> str:
        return f"{self.chain}#{self.seq} {self.kind}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise AppendOnlyError("Audit events are append-only; they cannot be updated.")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AppendOnlyError("Audit events are append-only; they cannot be deleted.")
