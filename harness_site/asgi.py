"""ASGI entry point: the agent API, the MCP gateway (/mcp/), the reviewer pages, and
reviewer WebSockets.

The agent API (/api/) gets its own Django handler whose middleware chain is async-native
(settings.HARNESS_API_MIDDLEWARE): bearer-token requests need no sessions, CSRF or
messages, and every sync middleware would cost a thread hop per request. Reviewer pages
keep the full chain of settings.MIDDLEWARE.
"""

from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "harness_site.settings")
django_asgi_app = get_asgi_application()

from django.conf import settings  # noqa: E402

from harness_site.embedded_redis import start_if_embedded  # noqa: E402
from harness_site.slow_clients import install as bound_slow_clients  # noqa: E402

start_if_embedded()
bound_slow_clients(settings.HARNESS_REQUEST_RECEIVE_TIMEOUT)

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.core.handlers.exception import convert_exception_to_response  # noqa: E402
from django.utils.module_loading import import_string  # noqa: E402

from approvals.routing import websocket_urlpatterns as approvals_ws  # noqa: E402
from audit.routing import websocket_urlpatterns as audit_ws  # noqa: E402
from dispatcher.gateways.mcp_http import application as mcp_gateway  # noqa: E402
from harness_site.websocket_origin import SameOriginValidator  # noqa: E402
from identity.mfa import SecondFactorSocketGate  # noqa: E402


class AgentAPIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        handler = convert_exception_to_response(self._get_response_async)  # type: ignore[attr-defined]
        for path in reversed(settings.HARNESS_API_MIDDLEWARE):
            handler = convert_exception_to_response(import_string(path)(handler))
        self._middleware_chain = handler


agent_api_app = AgentAPIHandler()


async def http_router(scope: dict[str, Any], receive: Any, send: Any) -> None:
    path = scope["path"]
    if path == "/mcp" or path.startswith("/mcp/"):
        await mcp_gateway(scope, receive, send)
        return
    app = agent_api_app if path.startswith("/api/") else django_asgi_app
    await app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http_router,
        "websocket": SameOriginValidator(
            AuthMiddlewareStack(SecondFactorSocketGate(URLRouter([*approvals_ws, *audit_ws])))
        ),
    }
)
