"""Sending one delivery over its channel: each raises DeliveryFailed with what went wrong.

Network calls only; what is sent is built in `messages`, what happened is recorded by
`services.deliver`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from typing import Any

from django.conf import settings
from django.core import mail

from floor import outbound


class DeliveryFailed(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """`sha256=<hex>` of HMAC-SHA256 over "<timestamp>.<body>" with the channel's secret."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()


def _post(url: str, body: bytes, headers: dict[str, str]) -> outbound.Answer:
    try:
        return outbound.send("POST", url, content=body, headers=headers)
    except outbound.OutboundRefused as error:
        raise DeliveryFailed(str(error)) from None


def _accepted(answer: outbound.Answer) -> int:
    """The status of a 2xx answer; any other raises with the status alone (the remote
    body is never recorded: it is whatever the receiver chose to send)."""
    if not 200 <= answer.status < 300:
        raise DeliveryFailed(f"HTTP {answer.status}", answer.status)
    return answer.status


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
    return _accepted(_post(url, body, headers))


def send_slack_webhook(url: str, text: str, blocks: list[dict[str, Any]]) -> int:
    body = json.dumps({"text": text, "blocks": blocks}).encode()
    return _accepted(_post(url, body, {"Content-Type": "application/json"}))


SLACK_API_URL = "https://slack.com/api/"
# Slack's error codes are short identifiers ("channel_not_found"); anything else is
# recorded as "error" rather than copied.
_SLACK_ERROR = re.compile(r"^[a-z0-9_]{1,60}$")


def send_slack_message(
    config: dict[str, Any], text: str, blocks: list[dict[str, Any]], ts: str = ""
) -> dict[str, str]:
    """Post (or with `ts`, update in place) a bot message; returns {"channel", "ts"}."""
    method = "chat.update" if ts else "chat.postMessage"
    fields: dict[str, Any] = {"channel": config["channel"], "text": text, "blocks": blocks}
    if ts:
        fields["ts"] = ts
    base = (config.get("api_url") or SLACK_API_URL).rstrip("/") + "/"
    headers = {
        "Content-Type": "application/json; charset=utf-8",
        "Authorization": f"Bearer {config['bot_token']}",
    }
    answer = _post(base + method, json.dumps(fields).encode(), headers)
    _accepted(answer)
    try:
        response = json.loads(answer.body)
        ok, message_ts = bool(response.get("ok")), str(response.get("ts", ""))
    except (ValueError, AttributeError):
        raise DeliveryFailed("Slack API answered something that is not JSON") from None
    if not ok or not message_ts:
        code = str(response.get("error", ""))
        raise DeliveryFailed(
            f"Slack API error: {code if _SLACK_ERROR.match(code) else 'error'}", answer.status
        )
    return {"channel": str(response.get("channel", config["channel"])), "ts": message_ts}


def send_email(to: list[str], subject: str, body: str) -> int:
    try:
        return mail.send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, to)
    except Exception as error:  # smtplib and socket errors: the code, never the server's text
        code = getattr(error, "smtp_code", None)
        raise DeliveryFailed(
            f"{type(error).__name__}" + (f" (SMTP {code})" if code else "")
        ) from None


def send_push(subscription: dict[str, Any], data: str) -> int:
    """Send through the door, to a known push service (or one listed in
    HARNESS_OUTBOUND_ALLOW)."""
    from py_vapid import Vapid
    from pywebpush import WebPushException, webpush

    if not settings.HARNESS_VAPID_PRIVATE_KEY:
        raise DeliveryFailed("Web Push needs HARNESS_VAPID_PRIVATE_KEY (manage.py vapid_keys).")
    try:
        outbound.check_url(str(subscription.get("endpoint", "")), push=True)
        key = Vapid.from_raw(settings.HARNESS_VAPID_PRIVATE_KEY.encode())
        response = webpush(
            subscription_info=subscription,
            data=data,
            vapid_private_key=key,
            vapid_claims={"sub": settings.HARNESS_VAPID_SUBJECT},
            ttl=int(settings.HARNESS_APPROVAL_TIMEOUT),
            requests_session=outbound.requests_session(push=True),
        )
    except outbound.OutboundRefused as error:
        raise DeliveryFailed(str(error)) from None
    except WebPushException as error:
        status = error.response.status_code if error.response is not None else None
        raise DeliveryFailed(f"Web Push refused: HTTP {status}", status) from None
    except Exception as error:  # the subscription's keys cannot be used
        raise DeliveryFailed(f"Web Push failed: {type(error).__name__}") from None
    return int(getattr(response, "status_code", 201))
