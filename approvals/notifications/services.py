"""Every change to channels, deliveries and push subscriptions, and the sending itself.

Who calls what: the approvals receivers enqueue `tasks.notify_ask` after an ask commits
and `tasks.notify_outcome` after it is decided or expires; those plan deliveries here
(one per channel, or per recipient for email and push) and each delivery is sent by its
own task (`deliver`), retried with backoff while it fails. Admins change channels with
`save_channel` / `set_enabled`; reviewers subscribe their browsers with `subscribe`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any
from uuid import UUID

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator, validate_email
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit import kinds
from audit.roles import REVIEWER
from audit.services import record_event
from dispatcher.errors import ServiceError
from dispatcher.models import Status

from .. import links
from ..models import ApprovalRequest
from . import messages, senders
from .models import Channel, Delivery, Kind, PushSubscription

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 6


class InvalidChannel(ServiceError):
    def __init__(self, problems: list[str]) -> None:
        super().__init__(" ".join(problems))
        self.problems = problems


# --- Who hears of an ask ------------------------------------------------------------------


def reviewers() -> Any:
    """Active users holding the reviewer role (superusers hold every role)."""
    return (
        User.objects.filter(is_active=True)
        .filter(Q(is_superuser=True) | Q(groups__name=REVIEWER))
        .distinct()
    )


def matches(channel: Channel, approval: ApprovalRequest) -> bool:
    call = approval.call
    rule = str(call.provenance.get("rule", ""))
    return (
        (not channel.match_agents or call.session.agent.name in channel.match_agents)
        and (not channel.match_tools or call.name in channel.match_tools)
        and (not channel.match_rules or rule in channel.match_rules)
    )


def recipients(channel: Channel, approval: ApprovalRequest) -> list[User]:
    """The channel's users and members of its groups who are reviewers (every reviewer
    when it names none), less the agent's owner when self-approval is forbidden."""
    people = reviewers()
    named_users = list(channel.users.values_list("pk", flat=True))
    named_groups = list(channel.groups.values_list("pk", flat=True))
    if named_users or named_groups:
        people = people.filter(Q(pk__in=named_users) | Q(groups__pk__in=named_groups)).distinct()
    if settings.HARNESS_FORBID_SELF_APPROVAL:
        people = people.exclude(pk=approval.call.session.agent.owner_id)
    return list(people.order_by("username"))


# --- Channels from the environment ------------------------------------------------------------

ENV_CHANNELS = {
    "HARNESS_WEBHOOK_URL": ("env: webhook", Kind.WEBHOOK),
    "HARNESS_SLACK_WEBHOOK_URL": ("env: slack", Kind.SLACK),
    "HARNESS_NOTIFY_EMAIL": ("env: email", Kind.EMAIL),
}


def _env_config(variable: str) -> dict[str, Any] | None:
    if variable == "HARNESS_WEBHOOK_URL" and settings.HARNESS_WEBHOOK_URL:
        return {"url": settings.HARNESS_WEBHOOK_URL, "secret": settings.HARNESS_WEBHOOK_SECRET}
    if variable == "HARNESS_SLACK_WEBHOOK_URL" and settings.HARNESS_SLACK_WEBHOOK_URL:
        return {"webhook_url": settings.HARNESS_SLACK_WEBHOOK_URL}
    if variable == "HARNESS_NOTIFY_EMAIL" and settings.HARNESS_NOTIFY_EMAIL:
        return {"addresses": list(settings.HARNESS_NOTIFY_EMAIL)}
    return None


def sync_env_channels() -> None:
    """Keep the channels the environment configures in step with it: each sends every
    ask to every reviewer; one whose variable is gone is disabled. Idempotent."""
    for variable, (name, kind) in ENV_CHANNELS.items():
        config = _env_config(variable)
        channel = Channel.objects.filter(source=variable).first()
        if config is None:
            if channel is not None and channel.enabled:
                Channel.objects.filter(pk=channel.pk).update(enabled=False)
            continue
        if channel is None:
            Channel.objects.create(name=name, kind=kind, config=config, source=variable)
        elif channel.config != config or not channel.enabled:
            Channel.objects.filter(pk=channel.pk).update(config=config, enabled=True)


# --- Planning and sending ----------------------------------------------------------------------

PLAN_ASK_TASK = "approvals.tasks.notify_ask"
PLAN_OUTCOME_TASK = "approvals.tasks.notify_outcome"
DELIVER_TASK = "approvals.tasks.deliver"


def _send_task(name: str, argument: Any) -> None:
    """One Celery message, never retried here: a broker that is down costs a notification
    (logged), never the request's time."""
    try:
        current_app.send_task(name, args=(argument,), retry=False)
    except Exception:
        logger.warning("could not enqueue %s(%s)", name, argument, exc_info=True)


def enqueue_ask(approval_id: int) -> None:
    """Inside the ask's transaction: after it commits, plan and send its notifications."""

    def send() -> None:
        if Channel.objects.filter(enabled=True).exists() or any(
            _env_config(variable) for variable in ENV_CHANNELS
        ):
            _send_task(PLAN_ASK_TASK, approval_id)

    transaction.on_commit(send, robust=True)


def enqueue_outcome(call_id: str) -> None:
    """After a call left pending: a second event where the ask was delivered."""
    if Delivery.objects.filter(
        approval__call_id=UUID(call_id), event=Delivery.Event.ASKED
    ).exists():
        _send_task(PLAN_OUTCOME_TASK, call_id)


def notify_ask(approval_id: int) -> None:
    for delivery_id in plan_ask(approval_id):
        _send_task(DELIVER_TASK, delivery_id)


def notify_outcome(call_id: str) -> None:
    approval = ApprovalRequest.objects.filter(call_id=UUID(call_id)).first()
    for delivery_id in plan_outcome(approval.pk) if approval is not None else []:
        _send_task(DELIVER_TASK, delivery_id)


def plan_ask(approval_id: int) -> list[str]:
    """Create the deliveries of one ask (after its commit); returns their ids to send."""
    sync_env_channels()
    approval = _approval(approval_id)
    if approval is None:
        return []
    planned: list[Delivery] = []
    for channel in Channel.objects.filter(enabled=True).prefetch_related("users", "groups"):
        if not matches(channel, approval):
            continue
        planned += _deliveries(channel, approval)
    Delivery.objects.bulk_create(planned)
    return [str(d.pk) for d in planned]


def _deliveries(channel: Channel, approval: ApprovalRequest) -> list[Delivery]:
    ask = {"channel": channel, "approval": approval, "event": Delivery.Event.ASKED}
    if channel.kind in (Kind.WEBHOOK, Kind.SLACK):
        return [Delivery(**ask)]
    people = recipients(channel, approval)
    if channel.kind == Kind.EMAIL:
        out = [Delivery(**ask, recipient=p, address=p.email) for p in people if p.email]
        known = {p.email.lower() for p in people if p.email}
        extra = [a for a in channel.config.get("addresses", []) if a.lower() not in known]
        return out + [Delivery(**ask, address=address) for address in extra]
    subscriptions = PushSubscription.objects.filter(user__in=people)
    return [Delivery(**ask, recipient=s.user, subscription=s) for s in subscriptions]


def plan_outcome(approval_id: int) -> list[str]:
    """After the call left pending: a second event for every webhook that was told of
    the ask, and an update in place of every Slack bot message."""
    approval = _approval(approval_id)
    if approval is None:
        return []
    asked = Delivery.objects.filter(approval=approval, event=Delivery.Event.ASKED).select_related(
        "channel"
    )
    planned, seen = [], set()
    for delivery in asked:
        channel = delivery.channel
        if channel.pk in seen or not channel.enabled:
            continue
        bot = channel.kind == Kind.SLACK and "bot_token" in channel.config
        if channel.kind == Kind.WEBHOOK or (bot and delivery.external.get("ts")):
            seen.add(channel.pk)
            planned.append(
                Delivery(
                    channel=channel,
                    approval=approval,
                    event=Delivery.Event.DECIDED,
                    external=delivery.external,
                )
            )
    Delivery.objects.bulk_create(planned)
    return [str(d.pk) for d in planned]


def _approval(approval_id: int) -> ApprovalRequest | None:
    return (
        ApprovalRequest.objects.select_related("call__session__agent")
        .prefetch_related("votes__voter")
        .filter(pk=approval_id)
        .first()
    )


def deliver(delivery_id: str) -> None:
    """Send one delivery and record what happened. Raises senders.DeliveryFailed (after
    recording it) while attempts remain, so the task retries it with backoff."""
    delivery = (
        Delivery.objects.select_related(
            "channel", "approval__call__session__agent", "recipient", "subscription"
        )
        .filter(pk=UUID(delivery_id))
        .first()
    )
    if delivery is None or delivery.state in (Delivery.State.SENT, Delivery.State.GAVE_UP):
        return
    if not delivery.channel.enabled:
        Delivery.objects.filter(pk=delivery.pk).update(
            state=Delivery.State.GAVE_UP, last_error="The channel was disabled."
        )
        return
    attempts = delivery.attempts + 1
    try:
        status, external = _send(delivery)
    except senders.DeliveryFailed as failure:
        state = Delivery.State.FAILED if attempts < MAX_ATTEMPTS else Delivery.State.GAVE_UP
        Delivery.objects.filter(pk=delivery.pk).update(
            attempts=attempts,
            state=state,
            last_error=str(failure)[:2000],
            response_status=failure.status,
        )
        logger.warning(
            "notification %s via %s failed (attempt %s): %s",
            delivery.pk,
            delivery.channel.name,
            attempts,
            failure,
        )
        if state == Delivery.State.FAILED:
            raise
        return
    Delivery.objects.filter(pk=delivery.pk).update(
        attempts=attempts,
        state=Delivery.State.SENT,
        sent_at=timezone.now(),
        response_status=status,
        external=external or delivery.external,
    )  # last_error stays: the page shows what failed before it went through


def _send(delivery: Delivery) -> tuple[int | None, dict[str, str] | None]:
    channel, approval = delivery.channel, delivery.approval
    asked = delivery.event == Delivery.Event.ASKED
    config = channel.config
    if channel.kind == Kind.WEBHOOK:
        people = recipients(channel, approval) if asked else []
        links_list = [
            {"reviewer": p.get_username(), **links.links_for(approval, p)} for p in people
        ]
        body = messages.webhook_body(approval, delivery.event, links_list, str(delivery.pk))
        return senders.send_webhook(config["url"], config.get("secret", ""), body), None
    if channel.kind == Kind.SLACK:
        people = recipients(channel, approval) if asked else []
        links_list = [
            {"reviewer": p.get_username(), **links.links_for(approval, p)} for p in people
        ]
        text = messages.summary(approval) if asked else messages.outcome_text(approval)
        blocks = messages.slack_blocks(approval, links_list, decided=not asked)
        if "bot_token" in config:
            return 200, senders.send_slack_message(
                config, text, blocks, ts=delivery.external.get("ts", "")
            )
        return senders.send_slack_webhook(config["webhook_url"], text, blocks), None
    if channel.kind == Kind.EMAIL:
        person = delivery.recipient
        person_links = links.links_for(approval, person) if person is not None else None
        text = messages.email_body(approval, person_links)
        sent = senders.send_email([delivery.address], messages.email_subject(approval), text)
        return sent, None
    subscription = delivery.subscription
    if subscription is None or delivery.recipient is None:
        raise senders.DeliveryFailed("The push subscription was removed.")
    info = {"endpoint": subscription.endpoint, "keys": subscription.keys}
    payload = messages.push_payload(approval, links.links_for(approval, delivery.recipient))
    return senders.send_push(info, payload), None


def still_asking(delivery_id: str) -> bool:
    return Delivery.objects.filter(
        pk=UUID(delivery_id), approval__call__status=Status.PENDING_APPROVAL
    ).exists()


# --- Configuration (the admin page) ---------------------------------------------------------

URL = URLValidator(schemes=["http", "https"])
NAME = re.compile(r"^[\w .:@+\-]{1,100}$")


def _names(text: Any) -> list[str]:
    items = text if isinstance(text, list) else str(text or "").replace("\n", ",").split(",")
    return [str(item).strip() for item in items if str(item).strip()]


def _check_url(value: str, label: str, problems: list[str]) -> None:
    try:
        URL(value)
    except ValidationError:
        problems.append(f"{label} must be an http(s) URL, not '{value}'.")


def clean_config(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """The config of a channel of `kind` from form fields; InvalidChannel names problems."""
    problems: list[str] = []
    config: dict[str, Any] = {}
    if kind == Kind.WEBHOOK:
        config = {"url": str(data.get("url", "")).strip(), "secret": str(data.get("secret", ""))}
        _check_url(config["url"], "The webhook URL", problems)
        if len(config["secret"]) < 16:
            problems.append("A webhook needs a secret of at least 16 characters to sign with.")
    elif kind == Kind.SLACK:
        if data.get("bot_token"):
            config = {
                "bot_token": str(data["bot_token"]).strip(),
                "channel": str(data.get("channel", "")).strip(),
            }
            if data.get("api_url"):
                config["api_url"] = str(data["api_url"]).strip()
                _check_url(config["api_url"], "The Slack API URL", problems)
            if not config["channel"]:
                problems.append("A Slack bot needs the channel to post in (an id such as C0123).")
        else:
            config = {"webhook_url": str(data.get("webhook_url", "")).strip()}
            _check_url(config["webhook_url"], "The Slack incoming webhook URL", problems)
    elif kind == Kind.EMAIL:
        config = {"addresses": _names(data.get("addresses", ""))}
        for address in config["addresses"]:
            try:
                validate_email(address)
            except ValidationError:
                problems.append(f"'{address}' is not an email address.")
    elif kind != Kind.WEBPUSH:
        problems.append(f"Unknown channel kind '{kind}': use {', '.join(Kind.values)}.")
    if problems:
        raise InvalidChannel(problems)
    return config


@transaction.atomic
def save_channel(*, actor: User, data: dict[str, Any], channel_id: int | None = None) -> Channel:
    """Create or change a channel from the admin page's fields, audited. InvalidChannel
    names every problem (nothing saved)."""
    kind, name = str(data.get("kind", "")), str(data.get("name", "")).strip()
    problems = [] if NAME.match(name) else ["Give the channel a name (letters, digits, spaces)."]
    try:
        config = clean_config(kind, data)
    except InvalidChannel as invalid:
        problems += invalid.problems
        config = {}
    usernames, group_names = _names(data.get("users", "")), _names(data.get("groups", ""))
    users = list(User.objects.filter(username__in=usernames))
    groups = list(Group.objects.filter(name__in=group_names))
    problems += [
        f"No user named '{u}'." for u in sorted(set(usernames) - {u.username for u in users})
    ]
    problems += [
        f"No group named '{g}'." for g in sorted(set(group_names) - {g.name for g in groups})
    ]
    same_name = Channel.objects.filter(name=name)
    if (same_name.exclude(pk=channel_id) if channel_id else same_name).exists():
        problems.append(f"A channel named '{name}' exists already.")
    if problems:
        raise InvalidChannel(problems)
    fields = {
        "name": name,
        "kind": kind,
        "config": config,
        "match_agents": _names(data.get("match_agents", "")),
        "match_tools": _names(data.get("match_tools", "")),
        "match_rules": [
            line.strip() for line in str(data.get("match_rules", "")).splitlines() if line.strip()
        ],
    }
    if channel_id is None:
        channel = Channel.objects.create(**fields)
    else:
        channel = Channel.objects.select_for_update().get(pk=channel_id)
        for key, value in fields.items():
            setattr(channel, key, value)
        channel.save()
    channel.users.set(users)
    channel.groups.set(groups)
    _audit(
        actor,
        channel,
        "saved",
        {**fields, "config": _redacted(config), "users": usernames, "groups": group_names},
    )
    return channel


@transaction.atomic
def set_enabled(*, actor: User, channel_id: int, enabled: bool) -> Channel:
    channel = Channel.objects.select_for_update().get(pk=channel_id)
    channel.enabled = enabled
    channel.save(update_fields=["enabled"])
    _audit(actor, channel, "enabled" if enabled else "disabled", {})
    return channel


def _redacted(config: dict[str, Any]) -> dict[str, Any]:
    return {k: ("(set)" if k in ("secret", "bot_token") and v else v) for k, v in config.items()}


def _audit(actor: User, channel: Channel, change: str, details: dict[str, Any]) -> None:
    record_event(
        kind=kinds.NOTIFICATION_CHANNEL_CHANGED,
        actor=f"user:{actor.get_username()}",
        subject=f"channel:{channel.pk}",
        payload={"channel": channel.name, "kind": channel.kind, "change": change, **details},
    )


def subscribe(*, user: User, endpoint: str, keys: Any) -> PushSubscription:
    """Store (or move to `user`) one browser's push subscription. ServiceError if invalid."""
    try:
        URL(endpoint)
    except ValidationError:
        raise ServiceError("The push endpoint must be an http(s) URL.") from None
    if not isinstance(keys, dict) or not all(
        isinstance(keys.get(k), str) for k in ("p256dh", "auth")
    ):
        raise ServiceError("The subscription needs its p256dh and auth keys.")
    subscription, _ = PushSubscription.objects.update_or_create(
        endpoint=endpoint,
        defaults={"user": user, "keys": {"p256dh": keys["p256dh"], "auth": keys["auth"]}},
    )
    return subscription


def recent_deliveries(limit: int = 100) -> list[Delivery]:
    return list(
        Delivery.objects.select_related("channel", "approval__call", "recipient").order_by(
            "-created_at"
        )[:limit]
    )


def channel_lines(values: Iterable[str]) -> str:
    return ", ".join(values)
