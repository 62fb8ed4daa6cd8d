"""The dashboard sockets' Origin check: scheme, host and port, as Django's CSRF check.

A browser sends a cross-site WebSocket handshake with the user's cookies, so the socket
itself must refuse pages of any other origin. Channels' AllowedHostsOriginValidator
compares only the host name against ALLOWED_HOSTS: a page served on another port of the
same host, or over the other scheme, read the whole live queue. This validator accepts a
handshake whose Origin is exactly the origin the socket was reached at (the scheme of the
socket, ws -> http and wss -> https, and its Host header, which must be in ALLOWED_HOSTS),
or one listed in CSRF_TRUSTED_ORIGINS (exactly, or `https://*.example.com` for its
subdomains), the same rules CsrfViewMiddleware applies to a POST. A missing or unreadable
Origin is refused: every browser sends one on a WebSocket handshake.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest
from django.utils.http import is_same_domain


class _Handshake(HttpRequest):
    """The handshake as Django reads a request: its Host (ALLOWED_HOSTS, and
    USE_X_FORWARDED_HOST when set) and its scheme (SECURE_PROXY_SSL_HEADER when set)."""

    def __init__(self, scope: dict[str, Any]) -> None:
        super().__init__()
        self.secure_socket = scope.get("scheme") == "wss"
        for name, value in scope.get("headers", []):
            key = name.decode("latin1").upper().replace("-", "_")
            self.META[f"HTTP_{key}"] = value.decode("latin1")

    def _get_scheme(self) -> str:
        return "https" if self.secure_socket else "http"


def _trusted(origin: str) -> bool:
    """CSRF_TRUSTED_ORIGINS, read as CsrfViewMiddleware reads it."""
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    parsed = urlsplit(origin)
    wildcards = (urlsplit(trusted) for trusted in settings.CSRF_TRUSTED_ORIGINS if "*" in trusted)
    return any(
        trusted.scheme == parsed.scheme
        and is_same_domain(parsed.netloc, trusted.netloc.lstrip("*"))
        for trusted in wildcards
    )


def origin_allowed(scope: dict[str, Any]) -> bool:
    """Is the handshake's Origin the socket's own origin, or a trusted one?"""
    request = _Handshake(scope)
    origin = request.META.get("HTTP_ORIGIN", "")
    if not origin or origin == "null":
        return False
    try:
        own = f"{request.scheme}://{request.get_host()}"
    except DisallowedHost:
        own = None
    try:
        return origin == own or _trusted(origin)
    except ValueError:  # an Origin urlsplit cannot read
        return False


class SameOriginValidator:
    """ASGI middleware: a WebSocket handshake from any other origin is denied (403)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator guards WebSocket connections only.")
        if origin_allowed(scope):
            await self.application(scope, receive, send)
            return
        await WebsocketDenier()(scope, receive, send)
