"""The base of the fake model APIs the coding-agent tests point the real CLIs at.

A `FakeModel` is an HTTP server on loopback with its own thread, a log of every request
(`requests` for the bodies, `paths` for every path asked for) and a script of answers:
the main loop's requests (those offering tools) get the scripted steps in order, then a
closing text; the others (titles, routing, checks) get the utility answer. What each API
looks like on the wire (its paths, its JSON, its server-sent events) is in its own module:
fake_anthropic.py, fake_openai.py, fake_gemini.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class FakeModel[StepT]:
    """Start with `with Fake([steps]) as api:`; `api.url` is the base URL the CLI is given."""

    # Appended to the server's address in `url`: the part of the base URL the CLI expects.
    base_path = ""
    # What a request offering no tools is answered: a CLI's side requests parse it.
    utility_answer = "Harness test"

    def __init__(self, steps: list[StepT], closing: str = "All done.") -> None:
        self.steps = list(steps)
        self.closing = closing
        self.requests: list[dict[str, Any]] = []  # every body answered with a step, in order
        self.paths: list[str] = []  # every path asked for, in order
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        # Polled every 50 ms, not 0.5 s: shutdown() waits for one poll.
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{self.base_path}"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def main_requests(self) -> list[dict[str, Any]]:
        """The requests of the main loop: those that offered the model tools."""
        return [body for body in self.requests if body.get("tools")]

    # --- what each API says differently ------------------------------------------------

    def say(self, text: str) -> StepT:
        raise NotImplementedError

    def answer_get(self, handler: ModelHandler, path: str) -> None:
        handler.send_json(404, self.error(404))

    def answer_post(self, handler: ModelHandler, path: str, body: dict[str, Any]) -> None:
        raise NotImplementedError

    def error(self, status: int) -> dict[str, Any]:
        return {"error": {"code": status, "message": "not found" if status == 404 else "bad"}}

    # --- answering ----------------------------------------------------------------------

    def next_step(self, body: dict[str, Any]) -> StepT:
        with self.lock:
            self.requests.append(body)
            if not body.get("tools"):
                return self.say(self.utility_answer)
            if self.steps:
                return self.steps.pop(0)
            return self.say(self.closing)

    def _handler(self) -> type[ModelHandler]:
        this: FakeModel[Any] = self

        class Handler(ModelHandler):
            fake = this

        return Handler


class ModelHandler(BaseHTTPRequestHandler):
    """Reads the request, logs its path, and leaves the answer to the fake."""

    protocol_version = "HTTP/1.1"
    fake: FakeModel[Any]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self.send_json(200, {})

    def do_GET(self) -> None:
        self.fake.paths.append(self.path)
        self.fake.answer_get(self, self.path.split("?", 1)[0])

    def do_POST(self) -> None:
        self.fake.paths.append(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self.send_json(400, self.fake.error(400))
            return
        self.fake.answer_post(self, self.path.split("?", 1)[0], body)

    def send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def send_events(self, chunks: Iterable[bytes], headers: dict[str, str] | None = None) -> None:
        """Server-sent events, each chunk flushed on its own, then the connection closed."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(chunk)
            self.wfile.flush()
        self.close_connection = True
