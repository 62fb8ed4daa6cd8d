"""Telling the org admins that someone broke the glass, over the notification channels
the deployment already has (docs/notifications.md): every enabled webhook and Slack
channel, email to the channel's addresses and to every admin with an address, Web Push to
the admins' browsers. Best effort and after commit: the audit event is the record."""

from __future__ import annotations

import json
import logging

from django.contrib.auth.models import User
from django.db.models import Q

from approvals.notifications import senders
from approvals.notifications.models import Channel, Kind, PushSubscription
from audit import kinds
from audit.models import AuditEvent
from audit.roles import ADMIN

logger = logging.getLogger(__name__)


def org_admins() -> list[User]:
    """Active people holding the admin role (superusers included)."""
    query = Q(is_superuser=True) | Q(groups__name=ADMIN)
    return list(User.objects.filter(query, is_active=True).distinct().order_by("pk"))


def break_glass_text(event: AuditEvent) -> str:
    payload = event.payload
    return (
        f"Break-glass sign-in to Harness: {payload.get('user')} signed in with a password "
        f"from {payload.get('address') or 'an unknown address'} at {event.created_at:%Y-%m-%d %H:%M:%S} UTC, "
        "while single sign-on is otherwise the only way in. If nobody expected it, "
        "deactivate the account and change its password. Audit event "
        f"{event.pk}."
    )


def notify_break_glass(event_id: int) -> list[str]:
    """Send the news of one break-glass sign-in everywhere; the channels it reached."""
    event = AuditEvent.objects.filter(pk=event_id, kind=kinds.USER_BREAK_GLASS).first()
    if event is None:
        return []
    text = break_glass_text(event)
    admins = org_admins()
    reached: list[str] = []
    for channel in Channel.objects.filter(enabled=True).order_by("pk"):
        try:
            if _send(channel, event, text, admins):
                reached.append(channel.name)
        except senders.DeliveryFailed as error:
            logger.warning("break-glass notice not sent on %s: %s", channel.name, error)
    return reached


def _send(channel: Channel, event: AuditEvent, text: str, admins: list[User]) -> bool:
    config = channel.config
    if channel.kind == Kind.WEBHOOK:
        body = {"event": kinds.USER_BREAK_GLASS, "audit_event": event.pk, **event.payload}
        senders.send_webhook(config["url"], config.get("secret", ""), body)
    elif channel.kind == Kind.SLACK and config.get("webhook_url"):
        senders.send_slack_webhook(config["webhook_url"], text, [])
    elif channel.kind == Kind.SLACK:
        senders.send_slack_message(config, text, [])
    elif channel.kind == Kind.EMAIL:
        to = sorted(set(config.get("addresses", [])) | {a.email for a in admins if a.email})
        if not to:
            return False
        senders.send_email(to, "[Harness] Break-glass sign-in", text)
    elif channel.kind == Kind.WEBPUSH:
        data = json.dumps({"title": "Harness: break-glass sign-in", "body": text})
        subscriptions = PushSubscription.objects.filter(user__in=admins)
        for sub in subscriptions:
            senders.send_push({"endpoint": sub.endpoint, "keys": sub.keys}, data)
        return subscriptions.exists()
    else:
        return False
    return True
