"""A fake Anthropic Messages API on loopback, for running the real Claude Code CLI offline.

It answers the way the real API does: `POST /v1/messages` with `"stream": true` as
server-sent events (message_start, content_block_start, content_block_delta with
text_delta or input_json_delta, content_block_stop, message_delta, message_stop), without
`stream` as one JSON message; `POST /v1/messages/count_tokens` with a token count. The
main loop's requests (those offering tools) get the scripted steps in order (a tool call
or a text), then a closing text; requests without tools (titles, summaries) get a short
text. Every request is recorded, so a test can read what the model was told, e.g. the
tool_result Claude Code sent after a denial.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "claude-sonnet-4-5-20250929"


@dataclass(frozen=True)
class Step:
    """One assistant turn: a tool call (`tool` and `input`) or a text."""

    tool: str = ""
    input: dict[str, Any] = field(default_factory=dict)
    text: str = ""


def tool_use(name: str, **arguments: Any) -> Step:
    return Step(tool=name, input=arguments)


def say(text: str) -> Step:
    return Step(text=text)


class FakeAnthropic:
    """Start with `with FakeAnthropic([steps]) as api:`; `api.url` is ANTHROPIC_BASE_URL."""

    def __init__(self, steps: list[Step], closing: str = "All done.") -> None:
        self.steps = list(steps)
        self.closing = closing
        self.requests: list[dict[str, Any]] = []  # every /v1/messages body, in order
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        # Polled every 50 ms, not 0.5 s: shutdown() waits for one poll.
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeAnthropic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- what the model was told ---------------------------------------------------------

    @property
    def main_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r.get("tools")]

    def tool_results(self) -> list[dict[str, Any]]:
        """Every tool_result block Claude Code sent back, in order (last request wins)."""
        results: dict[str, dict[str, Any]] = {}
        for request in self.main_requests:
            for message in request.get("messages", []):
                content = message.get("content")
                if message.get("role") != "user" or not isinstance(content, list):
                    continue
                for block in content:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        results[block.get("tool_use_id", "")] = block
        return list(results.values())

    def tool_names_offered(self) -> set[str]:
        return {tool.get("name", "") for r in self.main_requests for tool in r["tools"]}

    # --- answering --------------------------------------------------------------------------

    def _next(self, body: dict[str, Any]) -> Step:
        with self.lock:
            self.requests.append(body)
            if not body.get("tools"):
                return say("Harness test")
            if self.steps:
                return self.steps.pop(0)
            return say(self.closing)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self._json(200, {})

            def do_GET(self) -> None:
                self._json(200, {"data": [], "has_more": False})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._json(400, {"type": "error", "error": {"type": "invalid_request_error"}})
                    return
                path = self.path.split("?", 1)[0]
                if path.endswith("/count_tokens"):
                    self._json(200, {"input_tokens": max(1, len(json.dumps(body)) // 4)})
                    return
                if not path.endswith("/messages"):
                    self._json(404, {"type": "error", "error": {"type": "not_found_error"}})
                    return
                step = fake._next(body)
                if body.get("stream"):
                    self._stream(step, body)
                else:
                    self._json(200, _message(step, body))

            def _json(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("request-id", "req_" + uuid.uuid4().hex[:12])
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, step: Step, body: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.send_header("request-id", "req_" + uuid.uuid4().hex[:12])
                self.end_headers()
                for event, data in _events(step, body):
                    chunk = f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()
                    self.wfile.write(chunk)
                    self.wfile.flush()
                self.close_connection = True

        return Handler


def _usage(output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": 20,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _block(step: Step) -> dict[str, Any]:
    if step.tool:
        return {
            "type": "tool_use",
            "id": "toolu_" + uuid.uuid4().hex[:24],
            "name": step.tool,
            "input": step.input,
        }
    return {"type": "text", "text": step.text}


def _message(step: Step, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_" + uuid.uuid4().hex[:24],
        "type": "message",
        "role": "assistant",
        "model": body.get("model") or MODEL,
        "content": [_block(step)],
        "stop_reason": "tool_use" if step.tool else "end_turn",
        "stop_sequence": None,
        "usage": _usage(5),
    }


def _events(step: Step, body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    message = _message(step, body)
    block = message["content"][0]
    yield (
        "message_start",
        {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}},
    )
    if block["type"] == "tool_use":
        yield (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {**block, "input": {}}},
        )
        text = json.dumps(block["input"])
        for piece in (text[: len(text) // 2], text[len(text) // 2 :]):
            delta = {"type": "input_json_delta", "partial_json": piece}
            yield "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
    else:
        yield (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        )
        delta = {"type": "text_delta", "text": block["text"]}
        yield "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
    )
    yield "message_stop", {"type": "message_stop"}
