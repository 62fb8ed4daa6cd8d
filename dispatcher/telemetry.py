"""OpenTelemetry export: each finished call as an `execute_tool` span (GenAI semantic
conventions), sent to an OTLP/HTTP endpoint. Off unless HARNESS_OTEL_ENDPOINT is set, and
then only with the optional `otel` extra installed (`pip install 'harness[otel]'`).

Never on the admission path: the `call_changed` signal (sent after commit) only puts the
call's id on an in-process queue; a daemon thread reads the call and records its span, and
the SDK's batch processor exports from its own thread. A lost span (a full queue, an
unreachable collector) never changes a call; it is logged.

Span: name `execute_tool <tool>`, kind INTERNAL, from the call's arrival to its end, with
`gen_ai.operation.name` = execute_tool, `gen_ai.tool.name`, `gen_ai.tool.call.id`,
`gen_ai.tool.type` = function, `gen_ai.agent.name`, and Harness's own: the decision, who
or what decided it (a rule, a mode, a person), the rule, the arguments' digest and the
seconds it waited for a reviewer, sat in the queue and ran.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Any

from django.conf import settings
from django.db import close_old_connections

from dispatcher import signals
from dispatcher.models import TERMINAL_STATUSES, Status, ToolCall
from floor import outbound

logger = logging.getLogger(__name__)

QUEUE_SIZE = 10_000
ERROR_STATUSES = frozenset({Status.TIMED_OUT, Status.OUTCOME_UNKNOWN, Status.UNREPORTED})

_state: dict[str, Any] = {}
_lock = threading.Lock()


def enabled() -> bool:
    return bool(getattr(settings, "HARNESS_OTEL_ENDPOINT", ""))


def install() -> bool:
    """Listen for finished calls when an endpoint is configured; False when off (no
    endpoint) or when the `otel` extra is missing (logged once)."""
    if not enabled():
        return False
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        logger.warning(
            "HARNESS_OTEL_ENDPOINT is set but OpenTelemetry is not installed: "
            "pip install 'harness[otel]'. No spans are exported."
        )
        return False
    signals.call_changed.connect(_on_call_changed, dispatch_uid="harness-otel")
    return True


def _on_call_changed(sender: Any, *, call_id: str, status: str, **kwargs: Any) -> None:
    if status not in TERMINAL_STATUSES:
        return
    try:
        _queue().put_nowait(call_id)
    except queue.Full:
        logger.warning("OpenTelemetry queue full: no span for call %s", call_id)


def _queue() -> queue.Queue[str]:
    """This process's queue and its exporting thread, started on first use (again after
    a fork: a Celery pool process starts its own)."""
    with _lock:
        if _state.get("pid") != os.getpid():
            q: queue.Queue[str] = queue.Queue(QUEUE_SIZE)
            thread = threading.Thread(target=_run, args=(q,), name="harness-otel", daemon=True)
            _state.update(pid=os.getpid(), queue=q, thread=thread, provider=None)
            thread.start()
        return _state["queue"]  # type: ignore[no-any-return]


def _run(q: queue.Queue[str]) -> None:
    while True:
        call_id = q.get()
        try:
            export_call(call_id)
        except Exception:
            logger.warning("could not export a span for call %s", call_id, exc_info=True)
        finally:
            close_old_connections()
            q.task_done()


def _tracer() -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = _state.get("provider")
    if provider is None:
        endpoint = settings.HARNESS_OTEL_ENDPOINT.rstrip("/")
        if not endpoint.endswith("/v1/traces"):
            endpoint += "/v1/traces"
        resource = Resource.create({"service.name": settings.HARNESS_OTEL_SERVICE_NAME})
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(
            BatchSpanProcessor(
                # Through the outbound door (address policy, no redirects, size cap).
                OTLPSpanExporter(endpoint=endpoint, timeout=10, session=outbound.requests_session())
            )
        )
        _state["provider"] = provider
    return provider.get_tracer("harness")


def _seconds(start: Any, end: Any) -> float | None:
    return round((end - start).total_seconds(), 6) if start and end else None


def attributes(call: ToolCall) -> dict[str, Any]:
    """The span's attributes for a finished call (None values left out)."""
    provenance = call.provenance if isinstance(call.provenance, dict) else {}
    asked = call.decided_by.startswith("user:") or call.status in (Status.EXPIRED, Status.EDITED)
    waited_until = call.queued_at or call.finished_at
    values: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.tool_use_id,
        "gen_ai.tool.type": "function",
        "gen_ai.agent.name": call.session.agent.name,
        "harness.call.id": str(call.pk),
        "harness.session.id": str(call.session_id),
        "harness.call.status": call.status,
        "harness.decision": call.decision,
        "harness.decided_by": call.decided_by,
        "harness.rule": provenance.get("rule") or None,
        "harness.arguments.sha256": call.digest,
        "harness.executor": call.executor,
        "harness.wait_seconds": _seconds(call.created_at, waited_until) if asked else 0.0,
        "harness.queue_seconds": _seconds(call.queued_at, call.started_at),
        "harness.execute_seconds": _seconds(call.started_at, call.finished_at),
        "harness.is_error": call.is_error,
    }
    if call.status in ERROR_STATUSES or (call.is_error and call.status == Status.COMPLETED):
        values["error.type"] = "tool_error" if call.status == Status.COMPLETED else call.status
    return {k: v for k, v in values.items() if v is not None}


def export_call(call_id: str) -> None:
    """Record the finished call's span (exported by the batch processor)."""
    from opentelemetry.trace import SpanKind, StatusCode
    from opentelemetry.trace import Status as SpanStatus

    call = ToolCall.objects.select_related("session__agent").filter(pk=call_id).first()
    if call is None or call.status not in TERMINAL_STATUSES:
        return
    values = attributes(call)
    start = call.created_at
    end = call.finished_at or start
    span = _tracer().start_span(
        f"execute_tool {call.name}",
        kind=SpanKind.INTERNAL,
        start_time=int(start.timestamp() * 1e9),
        attributes=values,
    )
    if "error.type" in values:
        span.set_status(SpanStatus(StatusCode.ERROR, call.status))
    span.end(end_time=int(end.timestamp() * 1e9))


def flush(timeout: float = 10.0) -> bool:
    """Wait until every queued call has its span and the spans are sent (tests, shutdown)."""
    q = _state.get("queue")
    if q is not None and _state.get("pid") == os.getpid():
        q.join()
    provider = _state.get("provider")
    return bool(provider.force_flush(int(timeout * 1000))) if provider is not None else True


def reset() -> None:
    """Forget this process's exporter (tests: another endpoint next time)."""
    provider = _state.pop("provider", None)
    if provider is not None:
        provider.shutdown()
