"""A fake OpenAI Responses API on loopback, for running the real Codex CLI offline.

`POST /v1/responses` with `"stream": true` answers as server-sent events, as the real API
does (response.created, response.output_item.added, response.output_item.done,
response.completed); `GET /v1/models` lists one model. The requests of the main loop get
the scripted steps in order (a function call, a custom tool call such as a freeform
`apply_patch`, or a text), then a closing text. Every request is recorded, so a test can
read what the model was told, e.g. the function_call_output Codex sent after a denial.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "gpt-5-codex"


@dataclass(frozen=True)
class Step:
    """One assistant turn: a function call (`tool`, `arguments`), a custom tool call
    (`tool`, `custom_input`), or a text."""

    tool: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    custom_input: str | None = None
    text: str = ""


def call(name: str, **arguments: Any) -> Step:
    return Step(tool=name, arguments=arguments)


def custom_call(name: str, text: str) -> Step:
    return Step(tool=name, custom_input=text)


def say(text: str) -> Step:
    return Step(text=text)


class FakeOpenAI:
    """Start with `with FakeOpenAI([steps]) as api:`; `api.url` is the provider's base_url."""

    def __init__(self, steps: list[Step], closing: str = "All done.") -> None:
        self.steps = list(steps)
        self.closing = closing
        self.requests: list[dict[str, Any]] = []  # every /v1/responses body, in order
        self.paths: list[str] = []  # every path asked for
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        # Polled every 50 ms, not 0.5 s: shutdown() waits for one poll.
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> FakeOpenAI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- what the model was told ---------------------------------------------------------

    def tool_outputs(self) -> dict[str, str]:
        """call_id -> the output Codex sent back for it (function or custom tool call)."""
        outputs: dict[str, str] = {}
        for request in self.requests:
            for item in request.get("input", []):
                if isinstance(item, dict) and item.get("type") in (
                    "function_call_output",
                    "custom_tool_call_output",
                ):
                    output = item.get("output")
                    outputs[str(item.get("call_id"))] = (
                        output if isinstance(output, str) else json.dumps(output)
                    )
        return outputs

    def tool_names_offered(self) -> set[str]:
        names: set[str] = set()
        for request in self.requests:
            for tool in request.get("tools", []):
                if isinstance(tool, dict):
                    names.add(str(tool.get("name") or tool.get("type")))
        return names

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

            def do_GET(self) -> None:
                fake.paths.append(self.path)
                if self.path.split("?", 1)[0].endswith("/models"):
                    self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
                    return
                self._json(404, {"error": {"message": "not found", "type": "not_found"}})

            def do_POST(self) -> None:
                fake.paths.append(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._json(400, {"error": {"message": "bad json", "type": "invalid_request"}})
                    return
                if not self.path.split("?", 1)[0].endswith("/responses"):
                    self._json(404, {"error": {"message": "not found", "type": "not_found"}})
                    return
                step = fake._next(body)
                self._stream(step, body)

            def _json(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, step: Step, body: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                for data in _events(step, body):
                    chunk = f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()
                    self.wfile.write(chunk)
                    self.wfile.flush()
                self.close_connection = True

        return Handler


def _item(step: Step) -> dict[str, Any]:
    item_id = uuid.uuid4().hex[:24]
    if step.tool and step.custom_input is not None:
        return {
            "type": "custom_tool_call",
            "id": "ctc_" + item_id,
            "call_id": "call_" + item_id,
            "name": step.tool,
            "input": step.custom_input,
            "status": "completed",
        }
    if step.tool:
        return {
            "type": "function_call",
            "id": "fc_" + item_id,
            "call_id": "call_" + item_id,
            "name": step.tool,
            "arguments": json.dumps(step.arguments),
            "status": "completed",
        }
    return {
        "type": "message",
        "id": "msg_" + item_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": step.text, "annotations": []}],
    }


def _events(step: Step, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    response_id = "resp_" + uuid.uuid4().hex[:24]
    response = {
        "id": response_id,
        "object": "response",
        "model": body.get("model") or MODEL,
        "status": "in_progress",
        "output": [],
    }
    item = _item(step)
    yield {"type": "response.created", "response": response}
    yield {"type": "response.output_item.added", "output_index": 0, "item": item}
    if item["type"] == "message":
        text = step.text
        yield {
            "type": "response.output_text.delta",
            "item_id": item["id"],
            "output_index": 0,
            "content_index": 0,
            "delta": text,
        }
    yield {"type": "response.output_item.done", "output_index": 0, "item": item}
    usage = {
        "input_tokens": 20,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 25,
    }
    done = {**response, "status": "completed", "output": [item], "usage": usage}
    yield {"type": "response.completed", "response": done}
