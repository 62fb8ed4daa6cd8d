"""Receivers on loopback for the notification tests: a webhook server that checks
signatures and timestamps, a fake Slack API, a real SMTP server (aiosmtpd) and a fake
push service that pywebpush posts to."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

REPLAY_WINDOW = 300


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Server:
    url: str
    received: list[Received] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    fail_next: int = 0  # answer 500 to this many requests first

    def wait_for(self, count: int = 1, seconds: float = 20) -> list[Received]:
        deadline = time.monotonic() + seconds
        while len(self.received) < count:
            assert time.monotonic() < deadline, (
                f"got {len(self.received)} of {count}: {self.rejected}"
            )
            time.sleep(0.05)
        return self.received


def verify_webhook(secret: str, headers: dict[str, str], body: bytes) -> str | None:
    """Why a receiver must refuse this request, or None: the check a receiver makes."""
    timestamp = headers.get("x-harness-timestamp", "")
    given = headers.get("x-harness-signature", "")
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > REPLAY_WINDOW:
        return "stale or missing timestamp"
    expected = (
        "sha256="
        + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    )
    if not hmac.compare_digest(expected, given):
        return "bad signature"
    return None


@contextmanager
def http_server(respond: Any) -> Iterator[Server]:
    """A threaded HTTP server on 127.0.0.1; `respond(server, received) -> (status, body)`."""
    state: dict[str, Server] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            received = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            server = state["server"]
            if server.fail_next > 0:
                server.fail_next -= 1
                status, answer = 500, b"try again"
            else:
                status, answer = respond(server, received)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state["server"] = Server(f"http://127.0.0.1:{httpd.server_address[1]}")
    # Polled every 50 ms, not 0.5 s: shutdown() waits for one poll.
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state["server"]
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextmanager
def webhook_receiver(secret: str) -> Iterator[Server]:
    def respond(server: Server, received: Received) -> tuple[int, bytes]:
        problem = verify_webhook(secret, received.headers, received.body)
        if problem:
            server.rejected.append(problem)
            return 401, b'{"error": "refused"}'
        server.received.append(received)
        return 200, b"{}"

    with http_server(respond) as server:
        yield server


def slack_form(received: Received) -> dict[str, Any]:
    """A Slack Web API call's arguments, sent as JSON or as a form."""
    if received.headers.get("content-type", "").startswith("application/json"):
        return dict(received.json())
    form = {k: v[0] for k, v in parse_qs(received.body.decode()).items()}
    if "blocks" in form:
        form["blocks"] = json.loads(form["blocks"])
    return form


@contextmanager
def fake_slack() -> Iterator[Server]:
    """chat.postMessage / chat.update of the Web API (bot tokens checked) and an incoming
    webhook at /services/hook."""
    counter = iter(range(1, 10_000))

    def respond(server: Server, received: Received) -> tuple[int, bytes]:
        if received.path == "/services/hook":
            server.received.append(received)
            return 200, b"ok"
        if received.headers.get("authorization") != "Bearer xoxb-test-token":
            return 200, b'{"ok": false, "error": "invalid_auth"}'
        server.received.append(received)
        form = slack_form(received)
        ts = form.get("ts") or f"1700000000.{next(counter):06d}"
        return 200, json.dumps({"ok": True, "channel": form.get("channel"), "ts": ts}).encode()

    with http_server(respond) as server:
        yield server


@contextmanager
def push_service() -> Iterator[Server]:
    def respond(server: Server, received: Received) -> tuple[int, bytes]:
        server.received.append(received)
        return 201, b""

    with http_server(respond) as server:
        yield server


@dataclass
class Mailbox:
    port: int
    messages: list[Message] = field(default_factory=list)
    envelopes: list[list[str]] = field(default_factory=list)


@contextmanager
def smtp_server() -> Iterator[Mailbox]:
    """A real SMTP server (aiosmtpd) on 127.0.0.1."""
    from aiosmtpd.controller import Controller

    mailbox = Mailbox(port=0)

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
            mailbox.messages.append(message_from_bytes(envelope.content))
            mailbox.envelopes.append(list(envelope.rcpt_tos))
            return "250 OK"

    from tests.support.live import free_port

    mailbox.port = free_port()
    controller = Controller(Handler(), hostname="127.0.0.1", port=mailbox.port)
    controller.start()
    try:
        yield mailbox
    finally:
        controller.stop()


def mailers_for(mailbox: Mailbox) -> Any:
    """Django's mail settings sending through `mailbox` (an override_settings, to use as
    `with mailers_for(mailbox):`)."""
    from django.test import override_settings

    backend = "django.core.mail.backends.smtp.EmailBackend"
    options = {"host": "127.0.0.1", "port": mailbox.port, "timeout": 5}
    return override_settings(MAILERS={"default": {"BACKEND": backend, "OPTIONS": options}})
