"""OpenTelemetry export: each finished call reaches an OTLP/HTTP collector (a stand-in on
loopback) as an execute_tool span with the GenAI attributes and Harness's decision."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra is not installed")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)

from dispatcher import agents, signals, telemetry, transitions  # noqa: E402
from dispatcher.models import Status, ToolCall  # noqa: E402
from dispatcher.tools.registry import get_tool  # noqa: E402
from tests.support.factories import make_agent, submit_one  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


class Collector:
    """A tiny OTLP/HTTP receiver: keeps every POST to /v1/traces."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, bytes]] = []
        received = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append((self.path, self.headers.get("Content-Type", ""), body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(b"")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        # Polled every 50 ms, not 0.5 s: shutdown() waits for one poll.
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def spans(self) -> list[Any]:
        out = []
        for path, _, body in self.requests:
            assert path == "/v1/traces"
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    out += list(scope.spans)
        return out


def values(span: Any) -> dict[str, Any]:
    out = {}
    for attribute in span.attributes:
        v = attribute.value
        out[attribute.key] = getattr(v, v.WhichOneof("value"))
    return out


@pytest.fixture
def collector(settings: Any) -> Iterator[Collector]:
    stand_in = Collector()
    settings.HARNESS_OTEL_ENDPOINT = stand_in.url
    # The export goes through the outbound door: this loopback port is allowed.
    settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{stand_in.server.server_port}"]
    telemetry.reset()
    assert telemetry.install()
    yield stand_in
    signals.call_changed.disconnect(dispatch_uid="harness-otel")
    telemetry.reset()
    stand_in.server.shutdown()


def test_finished_calls_arrive_as_execute_tool_spans(collector: Collector) -> None:
    fx = make_agent(mode="standard")
    session = agents.start_session(agent=fx.agent, title="otel")
    rejected = submit_one(session, "no_such_tool", {}, tool_use_id="toolu_1")
    write = submit_one(session, "write_file", {"path": "a.txt", "content": "x"}, "toolu_2")
    assert ToolCall.objects.get(pk=write.pk).status == Status.PENDING_APPROVAL
    time.sleep(0.05)  # a measurable wait for the reviewer
    assert transitions.approve_call(call_id=write.pk, actor="user:rita")
    call = ToolCall.objects.get(pk=write.pk)
    assert transitions.claim(call, get_tool("write_file"))  # type: ignore[arg-type]
    transitions.finish(call, Status.COMPLETED, "wrote a.txt", False, 0.01)
    assert telemetry.flush()

    spans = {values(s)["gen_ai.tool.call.id"]: s for s in collector.spans()}
    assert set(spans) == {"toolu_1", "toolu_2"}  # finished calls only, once each
    done = spans["toolu_2"]
    attrs = values(done)
    assert done.name == "execute_tool write_file"
    assert attrs["gen_ai.operation.name"] == "execute_tool"
    assert attrs["gen_ai.tool.name"] == "write_file"
    assert attrs["gen_ai.agent.name"] == fx.agent.name
    assert attrs["harness.decision"] == "allow" and attrs["harness.decided_by"] == "user:rita"
    assert attrs["harness.arguments.sha256"] == call.digest
    assert attrs["harness.call.status"] == "completed"
    assert attrs["harness.wait_seconds"] >= 0.05
    assert done.end_time_unix_nano > done.start_time_unix_nano
    assert "error.type" not in attrs
    no_tool = values(spans["toolu_1"])
    assert no_tool["harness.call.status"] == "rejected" and no_tool["harness.wait_seconds"] == 0
    assert no_tool["gen_ai.tool.name"] == "no_such_tool"
    assert rejected.pk and no_tool["harness.call.id"] == str(rejected.pk)


def test_off_by_default_and_never_in_the_way(settings: Any) -> None:
    settings.HARNESS_OTEL_ENDPOINT = ""
    assert telemetry.install() is False
    assert signals.call_changed.disconnect(dispatch_uid="harness-otel") is False  # none there


@pytest.mark.heavy
def test_an_unreachable_collector_changes_nothing(settings: Any) -> None:
    settings.HARNESS_OTEL_ENDPOINT = "http://127.0.0.1:9"  # nothing listens there
    telemetry.reset()
    assert telemetry.install()
    try:
        fx = make_agent(mode="standard")
        session = agents.start_session(agent=fx.agent)
        started = time.perf_counter()
        call = submit_one(session, "no_such_tool", {})
        # Admission does not wait for the export: a bound for a wait on the collector (its
        # retries, the exporter's 10 s timeout), not for a loaded host's database trips.
        assert time.perf_counter() - started < 5
        assert ToolCall.objects.get(pk=call.pk).status == Status.REJECTED
        telemetry.flush(timeout=2)  # the export fails, logged, and nothing else happens
    finally:
        signals.call_changed.disconnect(dispatch_uid="harness-otel")
        telemetry.reset()
