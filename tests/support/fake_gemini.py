"""A fake Gemini API (generativelanguage) on loopback, for running the real Gemini CLI offline.

`POST /v1beta/models/{model}:streamGenerateContent?alt=sse` answers as server-sent events,
as the real API does (`data: {candidates: [...], usageMetadata: ...}` chunks);
`:generateContent` answers one JSON response and `:countTokens` a count. The requests of
the main loop (those offering tools) get the scripted steps in order (a functionCall or a
text), then a closing text; requests without tools (Gemini CLI's routing and checks) get
a short JSON text. Every request is recorded, so a test can read what the model was told,
e.g. the functionResponse Gemini CLI sent after a denial.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# What Gemini CLI's utility requests (its model router, its next-speaker check) parse.
UTILITY_ANSWER = json.dumps(
    {
        "reasoning": "A short test task.",
        "model_choice": "flash",
        "complexity_reasoning": "A short test task.",
        "complexity_score": 1,
        "next_speaker": "user",
    }
)


@dataclass(frozen=True)
class Step:
    """One model turn: a function call (`tool`, `args`) or a text."""

    tool: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    text: str = ""


def call(name: str, **args: Any) -> Step:
    return Step(tool=name, args=args)


def say(text: str) -> Step:
    return Step(text=text)


class FakeGemini:
    """Start with `with FakeGemini([steps]) as api:`; `api.url` is GOOGLE_GEMINI_BASE_URL."""

    def __init__(self, steps: list[Step], closing: str = "All done.") -> None:
        self.steps = list(steps)
        self.closing = closing
        self.requests: list[tuple[str, dict[str, Any]]] = []  # (path, body), in order
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        # Polled every 50 ms, not 0.5 s: shutdown() waits for one poll.
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeGemini:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- what the model was told ---------------------------------------------------------

    def main_requests(self) -> list[dict[str, Any]]:
        return [body for _, body in self.requests if body.get("tools")]

    def function_responses(self) -> list[dict[str, Any]]:
        """Every functionResponse Gemini CLI sent back, in order (the last request's)."""
        found: list[dict[str, Any]] = []
        for request in self.main_requests()[-1:]:
            for content in request.get("contents", []):
                for part in content.get("parts", []):
                    if isinstance(part, dict) and "functionResponse" in part:
                        found.append(part["functionResponse"])
        return found

    def tool_names_offered(self) -> set[str]:
        names: set[str] = set()
        for request in self.main_requests():
            for tool in request.get("tools", []):
                for declaration in tool.get("functionDeclarations", []) or []:
                    names.add(declaration.get("name", ""))
        return names

    # --- answering --------------------------------------------------------------------------

    def _next(self, path: str, body: dict[str, Any]) -> Step:
        with self.lock:
            self.requests.append((path, body))
            if not body.get("tools"):
                return say(UTILITY_ANSWER)
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
                self._json(200, {"models": []})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._json(400, {"error": {"code": 400, "message": "bad json"}})
                    return
                path = self.path.split("?", 1)[0]
                if path.endswith(":countTokens"):
                    self._json(200, {"totalTokens": max(1, len(json.dumps(body)) // 4)})
                    return
                if path.endswith(":streamGenerateContent"):
                    self._stream(fake._next(path, body))
                    return
                if path.endswith(":generateContent"):
                    self._json(200, _response(fake._next(path, body)))
                    return
                self._json(404, {"error": {"code": 404, "message": "not found"}})

            def _json(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, step: Step) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in _chunks(step):
                    self.wfile.write(f"data: {json.dumps(chunk)}\r\n\r\n".encode())
                    self.wfile.flush()
                self.close_connection = True

        return Handler


def _usage() -> dict[str, int]:
    return {"promptTokenCount": 20, "candidatesTokenCount": 5, "totalTokenCount": 25}


def _response(step: Step) -> dict[str, Any]:
    part: dict[str, Any] = (
        {"functionCall": {"name": step.tool, "args": step.args}}
        if step.tool
        else {"text": step.text}
    )
    return {
        "candidates": [
            {"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}
        ],
        "usageMetadata": _usage(),
        "modelVersion": "gemini-2.5-pro",
    }


def _chunks(step: Step) -> Iterator[dict[str, Any]]:
    if step.tool:
        yield _response(step)
        return
    half = len(step.text) // 2
    for piece, last in ((step.text[:half], False), (step.text[half:], True)):
        chunk = _response(say(piece))
        if not last:
            del chunk["candidates"][0]["finishReason"]
        yield chunk
