"""The real ASGI application, plus /bare/ served by a Django handler with no middleware."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.core.handlers.exception import convert_exception_to_response  # noqa: E402

from harness_site.asgi import application as harness_application  # noqa: E402

if os.environ.get("BENCH_NO_ENQUEUE") == "1":
    # S1b: admission without the enqueue. The call is still admitted and marked sent;
    # only the Celery message is not published (this server process only).
    from dispatcher import batches  # noqa: E402

    batches.enqueue = lambda call_id: None

if os.environ.get("BENCH_NO_INLINE") == "1":
    # S14's H0: Harness as it was before the inline lane (issue 37), in the same run:
    # every allowed call goes through the queue and the worker (this server process only).
    from dispatcher import admission  # noqa: E402

    _admit_message = admission.admit_message

    def _queued_only(**kwargs: Any) -> Any:
        return _admit_message(**{**kwargs, "inline": False})

    admission.admit_message = _queued_only


class BareHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        self._middleware_chain = convert_exception_to_response(self._get_response_async)


bare_app = BareHandler()


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http" and scope["path"].startswith("/bare/"):
        await bare_app(scope, receive, send)
    else:
        await harness_application(scope, receive, send)
