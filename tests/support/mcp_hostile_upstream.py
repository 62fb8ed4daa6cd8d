"""A hostile or broken streamable-HTTP MCP server for red-team tests, written by hand (the
SDK's server would not misbehave): JSON answers, no session id (so no GET stream).

    python tests/support/mcp_hostile_upstream.py PORT CALLS_FILE

Every tool is read-only by its annotations (a trusted server's calls are auto-allowed and
run inline). Each tools/call it receives adds a line `NAME TIME ARGUMENTS-JSON` (TIME: the
Unix time it arrived) to CALLS_FILE before it answers. What each tool answers:

  echo {text}       "echo: TEXT"
  probe {}          the value of the X-Probe header of the request that called it
  sleep {seconds}   "slept SECONDS", that many seconds later (while CALLS_FILE.sleep-hold
                    exists, it waits first until the file is removed, at most a minute)
  huge {megabytes}  a text result of that many megabytes, one JSON body sent in pieces
  never {}          nothing: the request is held open until the server stops
  close {}          the headers and a part of the body, then the connection closed
  garbage {}        200 application/json with bytes that are no JSON
  trickle {}        the headers and then a space every 0.2 s, never the body's end; when
                    the client has closed the connection, a line `trickle-closed TIME {}`
  forget {}         "forgotten", then every session the server gave is unknown to it (a
                    server restarted): a request naming one is answered 404

While CALLS_FILE.initialize-delay exists, each `initialize` is answered after the number
of seconds it holds (a server slow to start a session), CALLS_FILE.initialize-held
touched once it has read it. While CALLS_FILE.sessions exists,
each `initialize` is answered with a new Mcp-Session-Id, and a request naming no session
the server knows is answered 404 (else the server keeps no sessions). While
CALLS_FILE.cancel-delay exists, each `notifications/cancelled` is answered after the
number of seconds it holds (the client's sender, which sends one notification at a time,
held meanwhile), with a line `cancel-held TIME {}` when it arrives; while
CALLS_FILE.cancel-hold exists, each is held until the file is removed (at most a minute:
a test lets the sender go once it has done its part). While
CALLS_FILE.initialize-log exists, each `initialize` adds a line `initialize TIME
{"probe": X-PROBE}` as it arrives. While CALLS_FILE.bad-schemas exists, tools/list also
lists `remote_ref` and `ref_loop`, whose input schemas (BAD_SCHEMAS) are valid JSON Schema
that no arguments can be checked against (a `$ref` to a URL, a loop of `$ref`s).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TOOLS = ["echo", "probe", "sleep", "huge", "never", "close", "garbage", "trickle", "forget"]
CALLS_FILE = sys.argv[2] if len(sys.argv) > 2 else "/dev/null"
DELAY_FILE = Path(CALLS_FILE + ".initialize-delay")
DELAY_HELD_FILE = Path(CALLS_FILE + ".initialize-held")
CANCEL_DELAY_FILE = Path(CALLS_FILE + ".cancel-delay")
CANCEL_HOLD_FILE = Path(CALLS_FILE + ".cancel-hold")
SLEEP_HOLD_FILE = Path(CALLS_FILE + ".sleep-hold")
INITIALIZE_LOG_FILE = Path(CALLS_FILE + ".initialize-log")
SESSIONS_FILE = Path(CALLS_FILE + ".sessions")
SCHEMAS_FILE = Path(CALLS_FILE + ".bad-schemas")
# Input schemas that are valid JSON Schema but cannot be applied to any arguments.
BAD_SCHEMAS: dict[str, dict[str, Any]] = {
    "remote_ref": {
        "type": "object",
        "properties": {"text": {"$ref": "https://schemas.example/text.json"}},
    },
    "ref_loop": {
        "type": "object",
        "properties": {"text": {"$ref": "#/$defs/a"}},
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
    },
}
_written = threading.Lock()
_sessions: set[str] = set()


def tool(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"The hostile server's {name}.",
        "inputSchema": {"type": "object", "properties": {}, "additionalProperties": True},
        "annotations": {"readOnlyHint": True},
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def answer(
        self, body: bytes, status: int = 200, kind: str = "application/json", session: str = ""
    ) -> None:
        self.send_response(status)
        if session:
            self.send_header("Mcp-Session-Id", session)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def result(self, request_id: Any, result: dict[str, Any]) -> None:
        self.answer(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}).encode())

    def do_GET(self) -> None:
        self.answer(b"", 405)

    def do_DELETE(self) -> None:
        self.answer(b"", 405)

    def do_POST(self) -> None:
        message = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        method, request_id = message.get("method"), message.get("id")
        if (
            SESSIONS_FILE.is_file()
            and method != "initialize"
            and self.headers.get("Mcp-Session-Id") not in _sessions
        ):
            self.answer(b"", 404)  # (a session this server does not know, or forgot)
        elif request_id is None:  # a notification
            if method == "notifications/cancelled" and CANCEL_DELAY_FILE.is_file():
                self.note("cancel-held", {})
                time.sleep(float(CANCEL_DELAY_FILE.read_text()))
            elif method == "notifications/cancelled" and CANCEL_HOLD_FILE.is_file():
                self.note("cancel-held", {})
                deadline = time.monotonic() + 60
                while CANCEL_HOLD_FILE.is_file() and time.monotonic() < deadline:
                    time.sleep(0.02)
            self.answer(b"", 202)
        elif method == "initialize":
            if INITIALIZE_LOG_FILE.is_file():
                self.note("initialize", {"probe": self.headers.get("X-Probe", "")})
            try:  # a server slow to start a session
                delay = float(DELAY_FILE.read_text())
            except FileNotFoundError:
                delay = 0.0
            if delay:
                DELAY_HELD_FILE.touch()  # (a test may now take the delay file away)
                time.sleep(delay)
            session = ""
            if SESSIONS_FILE.is_file():
                session = f"s{len(_sessions)}-{time.time()}"
                _sessions.add(session)
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }
            body = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})
            self.answer(body.encode(), session=session)
        elif method == "tools/list":
            listed = [tool(name) for name in TOOLS]
            if SCHEMAS_FILE.exists():
                listed += [{**tool(n), "inputSchema": v} for n, v in BAD_SCHEMAS.items()]
            self.result(request_id, {"tools": listed})
        elif method == "ping":
            self.result(request_id, {})
        elif method == "tools/call":
            self.call(request_id, message["params"]["name"], message["params"].get("arguments"))
        else:
            self.answer(b"", 404)

    def note(self, name: str, arguments: Any) -> None:
        with _written, open(CALLS_FILE, "a") as calls:
            calls.write(f"{name} {time.time()} {json.dumps(arguments, sort_keys=True)}\n")

    def call(self, request_id: Any, name: str, arguments: Any) -> None:
        self.note(name, arguments)
        arguments = arguments or {}
        if name == "echo":
            self.result(request_id, text(f"echo: {arguments.get('text', '')}"))
        elif name == "probe":
            self.result(request_id, text(self.headers.get("X-Probe", "")))
        elif name == "sleep":
            deadline = time.monotonic() + 60
            while SLEEP_HOLD_FILE.is_file() and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(float(arguments.get("seconds", 1)))
            self.result(request_id, text(f"slept {arguments.get('seconds', 1)}"))
        elif name == "huge":
            self.huge(request_id, float(arguments.get("megabytes", 1)))
        elif name == "never":
            time.sleep(3600)
        elif name == "close":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b'{"jsonrpc": "2.0", "id": ')
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
        elif name == "garbage":
            self.answer(b"\x00\xff not json {{{" * 100)
        elif name == "trickle":
            self.trickle()
        elif name == "forget":
            self.result(request_id, text("forgotten"))
            _sessions.clear()

    def trickle(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "1000000")
        self.end_headers()
        self.close_connection = True
        try:
            while True:
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            with _written, open(CALLS_FILE, "a") as calls:
                calls.write(f"trickle-closed {time.time()} {{}}\n")

    def huge(self, request_id: Any, megabytes: float) -> None:
        payload = "x" * int(megabytes * (1 << 20))
        message = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": text(payload)})
        event = message.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(event)))
        self.end_headers()
        for start in range(0, len(event), 1 << 16):
            self.wfile.write(event[start : start + (1 << 16)])


def text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}], "isError": False}


if __name__ == "__main__":
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.request_queue_size = 256  # (64 calls connecting at once)
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
