"""Async-native middleware for the agent API (no thread hop per request), and the pages'
refusal of NUL characters (RefuseNulCharacters)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import markcoroutinefunction
from django.http import HttpRequest, HttpResponse


class APISecurityHeaders:
    """The headers the agent API needs: no sniffing, no caching, no framing."""

    async_capable = True
    sync_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], Awaitable[HttpResponse]]) -> None:
        self.get_response = get_response
        markcoroutinefunction(self)

    async def __call__(self, request: HttpRequest) -> HttpResponse:
        response = await self.get_response(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Cache-Control", "no-store")
        response.headers.setdefault("X-Frame-Options", "DENY")
        return response


# Not pages: the agent API (its own handler in production, harness_site.asgi: its token is
# checked before its body is read, and its JSON's NUL is refused as unstorable there), the
# MCP endpoint, and the agent-facing OAuth endpoints, which answer their own errors in
# OAuth's JSON (agentauth).
NUL_EXEMPT = (
    "/api/",
    "/mcp/",
    "/oauth/token/",
    "/oauth/revoke/",
    "/oauth/device-authorization/",
)
NUL_REFUSED = (
    "This request holds a NUL character (\\x00) in its address or a form field: no page "
    "accepts one. Remove it and send the request again."
)


class RefuseNulCharacters:
    """Pages: a NUL character in the path or a form field is refused (400) before any view
    reads it. PostgreSQL keeps no NUL in a text column, so every view that looked one up or
    stored one (a username, a feedback, a server's name, a rule) answered 500; a query
    parameter is left to its view (an unknown filter is a 404 there). Reads the form as
    CsrfViewMiddleware does (only form bodies are parsed), after keeping the raw body."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path_info.startswith(NUL_EXEMPT):
            return self.get_response(request)
        if request.method == "POST":
            # The raw body first, kept: a view that reads it (a JSON body) still can after
            # the form is parsed from it.
            request.body  # noqa: B018
        if "\x00" in request.path_info or (request.method == "POST" and _holds_nul(request.POST)):
            return HttpResponse(NUL_REFUSED, status=400, content_type="text/plain; charset=utf-8")
        return self.get_response(request)


def _holds_nul(form: Any) -> bool:
    return any(
        "\x00" in key or any("\x00" in value for value in values) for key, values in form.lists()
    )
