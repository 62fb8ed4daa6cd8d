"""Deleting an OAuth client revokes the agents people approved for it, whichever way it
is deleted.

The client is django-oauth-toolkit's model: besides services.delete_client (RFC 7592
DELETE, the admin), a deletion can come from the shell, from a user deleted with the
clients they own (a cascade), or from a queryset. Each deletes the agents' links and
tokens and left the agents active, linked to nothing. The receiver runs inside the
deletion's own transaction (Django's Collector.delete), so the revocations and their
audit events commit with the deletion or not at all; it is not a side effect that may be
lost (docs/security.md, "Agent sign-in")."""

from __future__ import annotations

from typing import Any

from django.db.models.signals import pre_delete
from oauth2_provider.models import get_application_model

from agentauth import services

# The actor a deletion outside delete_client is audited under: no person is known there.
DELETED_CLIENT_ACTOR = "harness:client-deleted"


def revoke_agents_of_deleted_client(sender: Any, instance: Any, **kwargs: Any) -> None:
    services.revoke_agents_of_client(application=instance, actor=DELETED_CLIENT_ACTOR)


def connect() -> None:
    pre_delete.connect(
        revoke_agents_of_deleted_client,
        sender=get_application_model(),
        dispatch_uid="agentauth.revoke_agents_of_deleted_client",
    )
