"""ASGI entry point: the agent API, the MCP gateway (/mcp/), the reviewer pages, and
reviewer WebSockets.

The agent API (/api/) gets its own Django handler whose middleware chain is async-native
(settings.HARNESS_API_MIDDLEWARE): bearer-token requests need no sessions, CSRF or
messages, and every sync middleware would cost a thread hop per request. Reviewer pages
keep the full chain of settings.MIDDLEWARE. The agent API borrows a running thread for a
request's synchronous work (harness_site.request_threads).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "harness_site.settings")
get_asgi_application()  # django.setup(); the pages get their handler below (pages_app)

from django.conf import settings  # noqa: E402

from harness_site.embedded_redis import start_if_embedded  # noqa: E402
from harness_site.request_threads import RequestThreads  # noqa: E402
from harness_site.slow_clients import body_bound  # noqa: E402
from harness_site.slow_clients import install as bound_slow_clients  # noqa: E402

start_if_embedded()
bound_slow_clients(
    settings.HARNESS_REQUEST_RECEIVE_TIMEOUT,
    settings.HARNESS_MAX_CONNECTIONS_PER_ADDRESS,
    body_bound(settings.HARNESS_MAX_BODY_BYTES),
    settings.HARNESS_RESPONSE_STALL_TIMEOUT,
)

from asgiref.sync import ThreadSensitiveContext  # noqa: E402
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.core.handlers.exception import convert_exception_to_response  # noqa: E402
from django.db import connections  # noqa: E402
from django.urls import get_resolver  # noqa: E402
from django.utils.module_loading import import_string  # noqa: E402

from approvals.routing import websocket_urlpatterns as approvals_ws  # noqa: E402
from audit.routing import websocket_urlpatterns as audit_ws  # noqa: E402
from dispatcher import limits, preload  # noqa: E402
from dispatcher.gateways.mcp_http import application as mcp_gateway  # noqa: E402
from harness_site.websocket_origin import SameOriginValidator  # noqa: E402
from identity.mfa import SecondFactorSocketGate  # noqa: E402


class AgentAPIHandler(ASGIHandler):
    """The agent API's handler: Django's, with its own async-native middleware chain and a
    thread borrowed for the request's synchronous work (its database work) instead of one
    started, and joined, for each request (harness_site.request_threads)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"This handler serves HTTP only, not {scope['type']}.")
        thread = request_threads.take()
        ended = False
        try:
            async with ThreadSensitiveContext(executor=thread):
                await self.handle(scope, receive, send)
            ended = True
        finally:
            if not ended:
                # Cancelled (daphne, a client gone) or raised before request_finished
                # closed the request's database connection: closed on its thread once the
                # work left there is done, and the thread then stops (never lent again).
                thread.submit(connections.close_all)
            request_threads.give_back(thread)

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        handler = convert_exception_to_response(self._get_response_async)  # type: ignore[attr-defined]
        for path in reversed(settings.HARNESS_API_MIDDLEWARE):
            handler = convert_exception_to_response(import_string(path)(handler))
        self._middleware_chain = handler


request_threads = RequestThreads()
agent_api_app = AgentAPIHandler()
# Reviewer pages: settings.MIDDLEWARE on Django's own handler (a thread per request).
# Borrowed threads there left a page's thread running after the test process's loop was
# gone (a hang at exit): not taken until that is understood (issue 31's note).
pages_app = ASGIHandler()


def app_path(scope: dict[str, Any]) -> str:
    """The request's path as Django resolves it: without its root path (FORCE_SCRIPT_NAME,
    else the scope's, which daphne takes from any client's Daphne-Root-Path header, and
    ServedAtTheRoot drops before this router). The
    router decides by this path: /x/api/v1/tools with a root path of /x is the agent API
    to Django, so it is to the router too (its early refusal, its handler)."""
    path: str = scope["path"]
    root = (settings.FORCE_SCRIPT_NAME or scope.get("root_path") or "").rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root) :]
    return path


async def http_router(scope: dict[str, Any], receive: Any, send: Any) -> None:
    path = app_path(scope)
    if path.startswith(("/api/", "/mcp")) and (refusal := limits.refused_scope(scope)):
        # The agent's token was refused for its rate moments ago, and still would be: the
        # answer costs no handler, no read and no Redis call (dispatcher.limits). It is
        # held up to EARLY_HOLD (a second; it goes on sooner if the refusal runs out and
        # it is the one request let through then): a client that retries at once on every
        # connection it opens sends one request a second on each, not as many as this
        # process can answer, and the held requests do not reach the handler together.
        deadline = asyncio.get_running_loop().time() + limits.EARLY_HOLD
        while refusal is not None:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                await answer_too_many_requests(send, refusal)
                return
            await asyncio.sleep(min(left, refusal.retry_after_ms / 1000))
            refusal = limits.refused_scope(scope)
    if path == "/mcp" or path.startswith("/mcp/"):
        await mcp_gateway(scope, receive, send)
        return
    app = agent_api_app if path.startswith("/api/") else pages_app
    await app(scope, receive, send)


async def answer_too_many_requests(send: Any, refusal: limits.TooManyRequests) -> None:
    """429 as the agent API and the MCP gateway send it (`too_many_requests`)."""
    error = {"code": "too_many_requests", "message": str(refusal)}
    body = json.dumps({"error": {**error, "retry_after_ms": refusal.retry_after_ms}}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(refusal.retry_after).encode()),
    ]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ServedAtTheRoot:
    """ASGI middleware: Harness is served at the root of its host, and no request names
    another root path. daphne takes a request's root path (Django's script name) from any
    client's `Daphne-Root-Path` header, and Django reverses every URL of that request under
    it: an agent that sent `https://evil.example` had the live queue's push of its ask,
    rendered in its request's thread, link every open queue to that site; a person who
    sent `/api` had the second-factor gate read `/api/approvals/` as the agent API's. The
    root path is dropped here, before anything reads it (FORCE_SCRIPT_NAME, a setting,
    stays Django's to apply)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("root_path"):
            scope = {**scope, "root_path": ""}
        await self.application(scope, receive, send)


application = ServedAtTheRoot(
    ProtocolTypeRouter(
        {
            "http": http_router,
            "websocket": SameOriginValidator(
                AuthMiddlewareStack(SecondFactorSocketGate(URLRouter([*approvals_ws, *audit_ws])))
            ),
        }
    )
)


def _freeze_what_start_up_loaded() -> None:
    """Everything loaded at start-up (Django, the apps, the URLconf and the views it
    imports: some 220,000 objects) lives as long as the process. A full garbage collection
    walked all of it, about 110 ms during which no request of this process moved: under
    one agent's flood, another agent's calls took several times their idle time (battery
    row D9). Frozen, collections walk only what requests made."""
    get_resolver().url_patterns  # noqa: B018  (imports every view now, not at a request)
    preload.load()  # (the MCP SDK and the shell parser, which the apps import where used)
    gc.collect()
    gc.freeze()


_freeze_what_start_up_loaded()
