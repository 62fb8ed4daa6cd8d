"""Configuring channels (the admin page, audited) and reviewers' push subscriptions."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator, validate_email
from django.db import transaction

from audit import kinds
from audit.services import record_event
from floor.errors import ServiceError

from .models import Channel, Delivery, Kind, PushSubscription


class InvalidChannel(ServiceError):
    """The channel cannot be saved; `problems` names each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(" ".join(problems))
        self.problems = problems


URL = URLValidator(schemes=["http", "https"])
# PushSubscription.endpoint's column; a browser's keys are base64url (a P-256 point is 87
# characters, the auth secret 22): anything else is not a browser's and is not stored.
ENDPOINT_MAX = PushSubscription._meta.get_field("endpoint").max_length or 1000
PUSH_KEY = re.compile(r"[A-Za-z0-9_\-]{1,200}={0,2}")
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
    """Store (or refresh the keys of) `user`'s subscription at `endpoint`; another
    person's subscription at the same endpoint is never touched. ServiceError if invalid."""
    try:
        URL(endpoint)
    except ValidationError:
        raise ServiceError("The push endpoint must be an http(s) URL.") from None
    if len(endpoint) > ENDPOINT_MAX:
        raise ServiceError(f"The push endpoint is longer than {ENDPOINT_MAX} characters.")
    if not isinstance(keys, dict) or not all(
        isinstance(keys.get(k), str) and PUSH_KEY.fullmatch(keys[k]) for k in ("p256dh", "auth")
    ):
        raise ServiceError(
            "The subscription needs its p256dh and auth keys (base64url, as the browser's "
            "PushSubscription.toJSON() gives them)."
        )
    subscription, _ = PushSubscription.objects.update_or_create(
        user=user,
        endpoint=endpoint,
        defaults={"keys": {"p256dh": keys["p256dh"], "auth": keys["auth"]}},
    )
    return subscription


def recent_deliveries(limit: int = 100) -> list[Delivery]:
    """The newest deliveries, for the admin page."""
    return list(
        Delivery.objects.select_related("channel", "approval__call", "recipient").order_by(
            "-created_at"
        )[:limit]
    )
