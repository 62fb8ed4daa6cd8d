"""Telling people about their accounts' events over the notification channels the
deployment already has (docs/notifications.md). Best effort and after commit: the audit
event is the record.

- Someone broke the glass: the org admins, over every enabled webhook and Slack channel,
  email to the channel's addresses and to every admin with an address, Web Push to the
  admins' browsers.
- A leaver's departure voided an agent's token (dispatcher.agents.void_tokens_shown_to):
  the agent's owner, by email (through an enabled email channel) and Web Push, and every
  enabled webhook and Slack channel, so that someone rotates it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from django.contrib.auth.models import User
from django.db.models import Q

from approvals.notifications import senders
from approvals.notifications.messages import slack_escape as slack
from approvals.notifications.models import Channel, Kind, PushSubscription
from approvals.notifications.services import names_agent
from audit import kinds
from audit.models import AuditEvent
from audit.roles import ADMIN
from dispatcher.models import Agent

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
    addresses = set(channel.config.get("addresses", [])) | {a.email for a in admins if a.email}
    return _deliver(
        channel,
        {"event": kinds.USER_BREAK_GLASS, "audit_event": event.pk, **event.payload},
        ("[Harness] Break-glass sign-in", "Harness: break-glass sign-in", text),
        addresses,
        admins,
    )


def _deliver(
    channel: Channel,
    webhook_body: dict[str, object],
    words: tuple[str, str, str],
    addresses: set[str],
    people: list[User],
    slack_text: str | None = None,
) -> bool:
    """One notice on one channel: the webhook's body, Slack's text (`slack_text`, its
    names escaped for Slack's markup, else the text), an email (subject, text) to
    `addresses`, Web Push (title, text) to `people`'s browsers. Whether it went anywhere
    (an email channel with no address, push with no browser: not)."""
    subject, title, text = words
    slack_text = text if slack_text is None else slack_text
    config = channel.config
    if channel.kind == Kind.WEBHOOK:
        senders.send_webhook(config["url"], config.get("secret", ""), webhook_body)
    elif channel.kind == Kind.SLACK and config.get("webhook_url"):
        senders.send_slack_webhook(config["webhook_url"], slack_text, [])
    elif channel.kind == Kind.SLACK:
        senders.send_slack_message(config, slack_text, [])
    elif channel.kind == Kind.EMAIL:
        if not addresses:
            return False
        senders.send_email(sorted(addresses), subject, text)
    elif channel.kind == Kind.WEBPUSH:
        data = json.dumps({"title": title, "body": text})
        subscriptions = PushSubscription.objects.filter(user__in=people)
        for sub in subscriptions:
            senders.send_push({"endpoint": sub.endpoint, "keys": sub.keys}, data)
        return subscriptions.exists()
    else:
        return False
    return True


def token_voided_text(event: AuditEvent, quote: Callable[[str], str] = str) -> str:
    """The notice; `quote` applied to each name in it (Slack's: `slack_escape`, since an
    agent's, a team's or a person's name is text its mrkdwn would read as links and
    mentions, `<!channel>` or `<https://…|rotate here>`)."""
    payload = event.payload
    name, owner, prefix, reason = (
        quote(str(payload.get(key))) for key in ("name", "owner", "token_prefix", "reason")
    )
    return (
        f"The token of Harness agent {name} (owner {owner}, token {prefix}…) was voided at "
        f"{event.created_at:%Y-%m-%d %H:%M:%S} UTC because {reason}. The agent is refused "
        "until its token is rotated: an admin of its team rotates it on the agent's page and "
        f"puts the new token where the agent runs. Audit event {event.pk}."
    )


def notify_token_voided(event_id: int) -> list[str]:
    """Tell the owner of one agent whose token a leaver's departure voided; the channels
    it reached. A channel whose route names agents (docs/notifications.md) hears only of
    those: the notice names the agent, its owner and who left."""
    event = AuditEvent.objects.filter(pk=event_id, kind=kinds.AGENT_TOKEN_VOIDED).first()
    if event is None:
        return []
    owner = User.objects.filter(username=event.payload.get("owner"), is_active=True).first()
    text = token_voided_text(event)
    team = _voided_team(event)
    reached: list[str] = []
    for channel in Channel.objects.filter(enabled=True).order_by("pk"):
        if channel.match_agents and not names_agent(
            channel.match_agents, str(event.payload.get("name")), team
        ):
            continue
        try:
            if _send_voided(channel, event, text, owner):
                reached.append(channel.name)
        except senders.DeliveryFailed as error:
            logger.warning("token-voided notice not sent on %s: %s", channel.name, error)
    return reached


def _voided_team(event: AuditEvent) -> str:
    """The voided agent's team, for a route naming `team/name`: the event's `team`, else
    (an event written before it named the team) the team of the agent its subject names
    (`agent:<pk>`) now."""
    team = event.payload.get("team")
    if isinstance(team, str):
        return team
    agent_id = event.subject.removeprefix("agent:")
    if not agent_id.isdigit():
        return ""
    return str(Agent.objects.filter(pk=agent_id).values_list("team__name", flat=True).first() or "")


def _send_voided(channel: Channel, event: AuditEvent, text: str, owner: User | None) -> bool:
    """To the owner only (not a channel's own addresses: the notice names who left)."""
    return _deliver(
        channel,
        {"event": kinds.AGENT_TOKEN_VOIDED, "audit_event": event.pk, **event.payload},
        ("[Harness] An agent's token was voided", "Harness: an agent's token was voided", text),
        {owner.email} if owner is not None and owner.email else set(),
        [owner] if owner is not None else [],
        slack_text=token_voided_text(event, slack),
    )
