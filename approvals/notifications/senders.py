"""Sending one delivery over its channel: each raises DeliveryFailed with what went wrong.

Network calls only; what is sent is built in `messages`, what happened is recorded by
`services.deliver`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

import requests
from django.conf import settings
from django.core import mail

TIMEOUT = 10


class DeliveryFailed(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """`sha256=<hex>` of HMAC-SHA256 over "<timestamp>.<body>" with the channel's secret."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def send_webhook(url: str, secret: str, payload: dict[str, Any]) -> int:
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Harness-Webhook/1",
        "X-Harness-Timestamp": timestamp,
        "X-Harness-Signature": signature(secret, timestamp, body),
        "X-Harness-Event": str(payload.get("event", "")),
        "X-Harness-Delivery": str(payload.get("delivery", "")),
    }
    try:
        response = requests.post(url, data=body, headers=headers, timeout=TIMEOUT)
    except requests.RequestException as error:
        raise DeliveryFailed(f"{type(error).__name__}: {error}") from None
    if not 200 <= response.status_code < 300:
        raise DeliveryFailed(
            f"HTTP {response.status_code}: {response.text[:300]}", response.status_code
        )
    return response.status_code


def send_slack_webhook(url: str, text: str, blocks: list[dict[str, Any]]) -> int:
    from slack_sdk.webhook import WebhookClient

    try:
        response = WebhookClient(url, timeout=TIMEOUT).send(text=text, blocks=blocks)
    except Exception as error:  # slack_sdk raises urllib's errors
        raise DeliveryFailed(f"{type(error).__name__}: {error}") from None
    if response.status_code != 200:
        raise DeliveryFailed(
            f"HTTP {response.status_code}: {response.body[:300]}", response.status_code
        )
    return int(response.status_code)


def slack_client(config: dict[str, Any]) -> Any:
    from slack_sdk import WebClient

    base_url = config.get("api_url") or WebClient.BASE_URL
    return WebClient(
        token=config["bot_token"], base_url=base_url.rstrip("/") + "/", timeout=TIMEOUT
    )


def send_slack_message(
    config: dict[str, Any], text: str, blocks: list[dict[str, Any]], ts: str = ""
) -> dict[str, str]:
    """Post (or with `ts`, update in place) a bot message; returns {"channel", "ts"}."""
    from slack_sdk.errors import SlackApiError

    client = slack_client(config)
    try:
        if ts:
            response = client.chat_update(
                channel=config["channel"], ts=ts, text=text, blocks=blocks
            )
        else:
            response = client.chat_postMessage(channel=config["channel"], text=text, blocks=blocks)
    except SlackApiError as error:
        raise DeliveryFailed(
            f"Slack API error: {error.response.get('error')}", error.response.status_code
        ) from None
    except Exception as error:
        raise DeliveryFailed(f"{type(error).__name__}: {error}") from None
    return {"channel": str(response.get("channel", config["channel"])), "ts": str(response["ts"])}


def send_email(to: list[str], subject: str, body: str) -> int:
    try:
        return mail.send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, to)
    except Exception as error:  # smtplib and socket errors
        raise DeliveryFailed(f"{type(error).__name__}: {error}") from None


def send_push(subscription: dict[str, Any], data: str) -> int:
    from py_vapid import Vapid
    from pywebpush import WebPushException, webpush

    if not settings.HARNESS_VAPID_PRIVATE_KEY:
        raise DeliveryFailed("Web Push needs HARNESS_VAPID_PRIVATE_KEY (manage.py vapid_keys).")
    try:
        key = Vapid.from_raw(settings.HARNESS_VAPID_PRIVATE_KEY.encode())
        response = webpush(
            subscription_info=subscription,
            data=data,
            vapid_private_key=key,
            vapid_claims={"sub": settings.HARNESS_VAPID_SUBJECT},
            timeout=TIMEOUT,
            ttl=int(settings.HARNESS_APPROVAL_TIMEOUT),
        )
    except WebPushException as error:
        status = error.response.status_code if error.response is not None else None
        raise DeliveryFailed(f"Web Push refused: {error}", status) from None
    except Exception as error:
        raise DeliveryFailed(f"{type(error).__name__}: {error}") from None
    return int(getattr(response, "status_code", 201))
