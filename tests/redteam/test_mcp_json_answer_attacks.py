"""Red-team of the fast path's JSON answer (dispatcher/gateways/mcp_fast.py: one
application/json body within JSON_WITHIN, else the SSE stream opened then). Against a
real daphne (responses read strictly with h11): hang-ups (FIN and RST) and a reviewer's
decisions around the window's end, pipelined requests of two agents on one connection,
HTTP/1.0, Accept as clients send it, daphne's http_timeout, a full wait cap and forty
held streams beside another agent's quick calls, the official client (one kept
connection, concurrent answers matched) and Codex's MCP client. In this process: the
wire's silence while a call waits (no longer than the SDK's), and the framing under
random answer, hang-up and send timings. Each test is an attack; it passes when the
attack fails."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import h11
import pytest

from dispatcher import limits
from dispatcher.models import Status, ToolCall
from tests.mcp.conftest import review, wait_for_pending
from tests.support.factories import AgentFixture, make_agent, make_user, unique
from tests.support.live import LiveStack

# (The live tests, each against a real daphne, take seconds to tens of seconds: `slow`.)

PROMPT = {"tool_name": "Write", "input": {"file_path": "notes/x.txt", "content": "y"}}


def call(request_id: Any, name: str = "approval_prompt", arguments: Any = None) -> bytes:
    params = {"name": name, "arguments": PROMPT if arguments is None else arguments}
    message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    return json.dumps(message).encode()


def session_of(stack: LiveStack, fx: AgentFixture) -> str:
    return stack.mcp_session(fx, "rtjson")


def request_bytes(
    stack: LiveStack,
    fx: AgentFixture,
    session: str,
    payload: bytes,
    *,
    version: str = "HTTP/1.1",
    extra: list[tuple[str, str]] | None = None,
) -> bytes:
    host = stack.url.removeprefix("http://")
    head = [
        f"POST /mcp/ {version}",
        f"Host: {host}",
        f"Content-Length: {len(payload)}",
        f"Authorization: Bearer {fx.token}",
        "Content-Type: application/json",
        "Accept: application/json, text/event-stream",
        f"Mcp-Session-Id: {session}",
        "MCP-Protocol-Version: 2025-06-18",
    ]
    head += [f"{k}: {v}" for k, v in extra or []]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


def connect(stack: LiveStack) -> socket.socket:
    host, port = stack.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    chunks: list[bytes] = field(default_factory=list)

    def json_rpc(self) -> list[Any]:
        """The JSON-RPC messages: the JSON body, or the SSE `message` events' data."""
        kind = self.headers.get("content-type", "")
        if kind == "application/json":
            return [json.loads(self.body)]
        assert kind == "text/event-stream", self.headers
        events = [e for e in self.body.split(b"\r\n\r\n") if e]
        messages = []
        for event in events:
            lines = event.split(b"\r\n")
            if all(line.startswith(b":") for line in lines):
                continue  # a ping
            assert lines[0] == b"event: message", event
            assert len(lines) == 2 and lines[1].startswith(b"data: "), event
            messages.append(json.loads(lines[1][len(b"data: ") :]))
        return messages


def read_responses(
    sock: socket.socket, count: int, *, version: bytes = b"1.1", seconds: float = 30
) -> tuple[list[Response], bytes]:
    """`count` responses read strictly (h11: framing, one start per response, nothing
    after a body's end but the next response); and the bytes left after them."""
    conn = h11.Connection(h11.CLIENT)
    # (h11 as the client: it must have "sent" a request to read its answer)
    responses: list[Response] = []
    sock.settimeout(seconds)
    current: Response | None = None
    for _ in range(count):
        conn.send(
            h11.Request(
                method="POST",
                target="/mcp/",
                headers=[("Host", "x"), ("Content-Length", "0")],
                http_version=version,
            )
        )
        conn.send(h11.EndOfMessage())
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = sock.recv(65536)
                conn.receive_data(data)
                if not data and conn.their_state is not h11.DONE:
                    raise AssertionError(f"connection closed mid-response: {current}")
                continue
            if isinstance(event, h11.Response):
                assert current is None
                current = Response(
                    event.status_code,
                    {k.decode(): v.decode() for k, v in event.headers},
                    b"",
                )
            elif isinstance(event, h11.InformationalResponse):
                continue
            elif isinstance(event, h11.Data):
                assert current is not None
                current.body += event.data
                current.chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                assert current is not None
                responses.append(current)
                current = None
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise AssertionError("closed before a response")
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            break
        conn.start_next_cycle()
    leftover = conn.trailing_data[0]
    return responses, leftover


def daphne_log(stack: LiveStack) -> str:
    return (stack.log_dir / "daphne.log").read_text(errors="replace")


def assert_quiet(stack: LiveStack, before: int) -> None:
    tail = daphne_log(stack)[before:]
    for bad in (
        "Traceback",
        "Exception inside application",
        "never retrieved",
        "ERROR",
        "took too long to shut down",
        "timed out",
    ):
        assert bad not in tail, tail[-4000:]


def wait_slots_free(fx: AgentFixture, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while limits.waits_held(fx.agent) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert limits.waits_held(fx.agent) == 0


# --- a client hanging up around the window's end ---------------------------------------


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.parametrize("rst", [False, True])
def test_hang_up_around_the_json_window_leaves_the_call_and_frees_the_slot(
    live_stack: LiveStack, live_db: None, rst: bool
) -> None:
    fx = make_agent(mode="standard")
    session = session_of(live_stack, fx)
    before = len(daphne_log(live_stack))
    seen: dict[float, bytes] = {}
    for n, delay in enumerate([0.3, 0.9, 0.97, 0.99, 1.0, 1.01, 1.03, 1.1, 1.5]):
        sock = connect(live_stack)
        sent = time.monotonic()
        sock.sendall(request_bytes(live_stack, fx, session, call(100 + n)))
        time.sleep(max(0.0, delay - (time.monotonic() - sent)))
        sock.setblocking(False)
        try:
            seen[delay] = sock.recv(65536)
        except BlockingIOError:
            seen[delay] = b""
        if rst:
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
        sock.close()
        wait_slots_free(fx)
    calls = ToolCall.objects.filter(session__external_id=session.split("~")[0])
    assert calls.count() == 9
    assert set(calls.values_list("status", flat=True)) == {Status.PENDING_APPROVAL}
    for delay, data in seen.items():
        if data:  # the SSE stream's headers, nothing of a JSON answer
            assert data.startswith(b"HTTP/1.1 200"), (delay, data)
            assert b"text/event-stream" in data and b"application/json" not in data, data
    time.sleep(11.5)  # past daphne's application_close_timeout: nothing left to kill
    assert_quiet(live_stack, before)


# --- a reviewer deciding at the window's end ---------------------------------------------


@pytest.mark.live
@pytest.mark.slow
def test_a_decision_at_the_window_end_is_one_well_framed_answer(
    live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="standard")
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    session = session_of(live_stack, fx)
    before = len(daphne_log(live_stack))
    modes = []
    # RT_JSON_SWEEP="0.96,0.001,60": the decision in 1 ms steps across the window's end.
    start, step, runs = map(float, os.environ.get("RT_JSON_SWEEP", "0.8,0.02,24").split(","))
    for n in range(int(runs)):
        target = start + step * n
        sock = connect(live_stack)
        sent = time.monotonic()
        sock.sendall(request_bytes(live_stack, fx, session, call(200 + n)))
        pending = wait_for_pending(session.split("~")[0], tool="client_tool")
        time.sleep(max(0.0, target - (time.monotonic() - sent)))
        decided = time.monotonic() - sent
        review(pending, reviewer, approve=True)
        # The answer, then another request on the same connection: nothing of the first
        # answer may spill into the second.
        sock.sendall(request_bytes(live_stack, fx, session, call(900 + n, "readFile", {})))
        (first, second), left = read_responses(sock, 2)
        sock.close()
        [m1] = first.json_rpc()
        [m2] = second.json_rpc()
        assert (
            m1["id"] == 200 + n
            and json.loads(m1["result"]["content"][0]["text"])["behavior"] == "allow"
        ), m1
        assert m2["id"] == 900 + n and second.headers["content-type"] == "application/json"
        assert left == b""
        kind = first.headers["content-type"]
        if kind == "application/json":
            assert first.headers["content-length"] == str(len(first.body))
            assert "transfer-encoding" not in first.headers
        else:
            assert first.headers.get("transfer-encoding") == "chunked", first.headers
        modes.append((round(target, 2), round(decided, 3), kind))
    print(modes)
    assert {m[2] for m in modes} == {"application/json", "text/event-stream"}
    wait_slots_free(fx)
    assert_quiet(live_stack, before)


# --- pipelined requests of two agents on one connection; HTTP/1.0 ------------------------


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.parametrize("held_at", [0, 1, 2])
@pytest.mark.parametrize("decide_after", [0.3, 2.0])
def test_pipelined_answers_stay_in_order_and_with_their_agent(
    live_stack: LiveStack, live_db: None, held_at: int, decide_after: float
) -> None:
    x, y = make_agent(mode="standard"), make_agent(mode="standard")
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    sx, sy = session_of(live_stack, x), session_of(live_stack, y)
    before = len(daphne_log(live_stack))
    plan = [(x, sx, 1), (y, sy, 2), (x, sx, 3)]
    raw = b""
    for i, (fx, s, rid) in enumerate(plan):
        body = call(rid) if i == held_at else call(rid, "readFile", {"path": "a"})
        raw += request_bytes(live_stack, fx, s, body)
    sock = connect(live_stack)
    sock.sendall(raw)
    fx, s, _ = plan[held_at]
    pending = wait_for_pending(s.split("~")[0], tool="client_tool")
    time.sleep(decide_after)
    review(pending, reviewer, approve=True)
    responses, left = read_responses(sock, 3)
    sock.close()
    assert left == b""
    for (_, s, rid), response in zip(plan, responses, strict=True):
        [message] = response.json_rpc()
        assert message["id"] == rid
        assert response.headers["mcp-session-id"] == s
    assert_quiet(live_stack, before)


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.parametrize("decide_after", [None, 0.2, 1.5])
def test_http_1_0_gets_a_whole_answer(
    live_stack: LiveStack, live_db: None, decide_after: float | None
) -> None:
    fx = make_agent(mode="standard")
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    session = session_of(live_stack, fx)
    before = len(daphne_log(live_stack))
    body = call(5, "readFile", {}) if decide_after is None else call(5)
    sock = connect(live_stack)
    sock.sendall(request_bytes(live_stack, fx, session, body, version="HTTP/1.0"))
    if decide_after is not None:
        pending = wait_for_pending(session.split("~")[0], tool="client_tool")
        time.sleep(decide_after)
        review(pending, reviewer, approve=True)
    data = b""
    sock.settimeout(30)
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    print(head)
    assert b"chunked" not in head.lower()
    response = Response(200, {}, rest)
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.decode().partition(":")
        response.headers[k.strip().lower()] = v.strip()
    [message] = response.json_rpc()
    assert message["id"] == 5
    if "content-length" in response.headers:
        assert int(response.headers["content-length"]) == len(rest)
    assert_quiet(live_stack, before)


# --- the official client: one connection kept, answers matched under concurrency ---------


class CountingProxy:
    """A TCP proxy to the live daphne that counts the connections clients open."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@pytest.mark.live
@pytest.mark.slow
def test_official_client_keeps_its_connection_and_matches_concurrent_answers(
    live_stack: LiveStack, live_db: None
) -> None:
    import anyio
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    from tests.mcp.conftest import run, text_of

    fx = make_agent(mode="standard")
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    proxy = CountingProxy(live_stack.url)
    before = len(daphne_log(live_stack))

    def approve_later(delay: float, seen: int) -> None:
        deadline = time.monotonic() + 20
        while True:
            calls = list(
                ToolCall.objects.filter(
                    session__agent=fx.agent, name="client_tool", status="pending_approval"
                )
            )
            if len(calls) >= seen or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        time.sleep(delay)
        for c in calls:
            review(c, reviewer, approve=True)

    async def scenario() -> tuple[int, int, list[str]]:
        http = httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {fx.token}"}, timeout=httpx2.Timeout(30, read=60)
        )
        async with (
            http,
            streamable_http_client(proxy.url + "/mcp/", http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            await session.call_tool("readFile", {"path": "warm"})
            await anyio.sleep(0.5)
            after_init = proxy.accepted
            for i in range(5):
                r = await session.call_tool("readFile", {"path": str(i)})
                assert r.is_error and "readFile" in text_of(r)
            sequential = proxy.accepted - after_init
            out: dict[str, str] = {}

            async def one(key: str, name: str, args: dict[str, Any]) -> None:
                out[key] = text_of(await session.call_tool(name, args))

            async with anyio.create_task_group() as tg:
                tg.start_soon(one, "held-a", "approval_prompt", {**PROMPT, "tool_use_id": "a"})
                tg.start_soon(one, "held-b", "approval_prompt", {**PROMPT, "tool_use_id": "b"})
                for i in range(6):
                    tg.start_soon(one, f"quick-{i}", f"nope{i}", {"path": f"q{i}"})
            return after_init, sequential, [f"{k}={v[:60]}" for k, v in sorted(out.items())]

    t = threading.Thread(target=approve_later, args=(1.5, 2), daemon=True)
    t.start()
    after_init, sequential, results = run(scenario)
    t.join(30)
    print(after_init, sequential, results)
    assert sequential == 0
    for r in results:
        key, _, text = r.partition("=")
        if key.startswith("quick-"):
            assert f"'nope{key[-1]}'" in text, r
        else:
            assert '"behavior": "allow"' in text or '"behavior":"allow"' in text, r
    wait_slots_free(fx)
    assert_quiet(live_stack, before)


# --- many held calls: the cap, another agent's quick calls, every slot back -------------


@pytest.mark.live
@pytest.mark.slow
def test_a_full_wait_cap_starves_nobody_else_and_every_slot_comes_back(
    live_stack: LiveStack, live_db: None
) -> None:
    a, b = make_agent(mode="standard"), make_agent(mode="standard")
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    sa, sb = session_of(live_stack, a), session_of(live_stack, b)
    before = len(daphne_log(live_stack))
    held = []
    for n in range(8):  # HARNESS_MAX_WAITS_PER_AGENT
        sock = connect(live_stack)
        sock.sendall(request_bytes(live_stack, a, sa, call(300 + n)))
        held.append(sock)
    deadline = time.monotonic() + 20
    while limits.waits_held(a.agent) < 8:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # The ninth: refused at once, as one JSON body.
    sock = connect(live_stack)
    started = time.monotonic()
    sock.sendall(request_bytes(live_stack, a, sa, call(399)))
    [refused], _ = read_responses(sock, 1)
    sock.close()
    assert time.monotonic() - started < 1.0
    assert refused.headers["content-type"] == "application/json"
    assert refused.json_rpc()[0]["error"]["code"] == -32029
    # Another agent, meanwhile: quick JSON answers on one kept connection, and a held call.
    sock = connect(live_stack)
    for n in range(10):
        started = time.monotonic()
        sock.sendall(request_bytes(live_stack, b, sb, call(400 + n, f"nope{n}", {})))
        [quick], _ = read_responses(sock, 1)
        assert time.monotonic() - started < 1.0
        assert quick.headers["content-type"] == "application/json"
        assert quick.json_rpc()[0]["id"] == 400 + n
    sock.close()
    b_held = connect(live_stack)
    b_held.sendall(request_bytes(live_stack, b, sb, call(450)))
    pending_b = wait_for_pending(sb.split("~")[0], tool="client_tool")
    time.sleep(1.3)  # past the window: on the SSE stream
    review(pending_b, reviewer, approve=True)
    [answer], _ = read_responses(b_held, 1)
    b_held.close()
    assert answer.headers["content-type"] == "text/event-stream"
    assert answer.json_rpc()[0]["id"] == 450
    # A's held calls: half answered by a reviewer, half hung up on; every slot comes back.
    time.sleep(0.5)
    pending = list(
        ToolCall.objects.filter(session__agent=a.agent, status="pending_approval").order_by(
            "created_at"
        )
    )
    assert len(pending) == 8
    for c in pending[:4]:
        review(c, reviewer, approve=False, feedback="no")
    ready: list[socket.socket] = []
    deadline = time.monotonic() + 15
    while len(ready) < 4 and time.monotonic() < deadline:
        ready = select.select(held, [], [], 0.2)[0]
    for sock in held:
        if sock not in ready:
            sock.close()  # the other four hang up
    answered = []
    for sock in ready:
        [r], _ = read_responses(sock, 1)
        sock.close()
        answered.append(r.json_rpc()[0]["id"])
    assert len(answered) == 4
    wait_slots_free(a)
    wait_slots_free(b)
    assert_quiet(live_stack, before)


# --- daphne's own http_timeout --------------------------------------------------------------


@pytest.mark.live
@pytest.mark.slow
def test_daphne_http_timeout_ends_a_held_stream_without_a_traceback(
    live_stack: LiveStack, live_db: None, tmp_path: Any
) -> None:
    from tests.support.live import daphne, free_port

    port = free_port()
    log = tmp_path / "daphne-timeout.log"
    with daphne(live_stack.env, port, log, ("--http-timeout", "3")):
        stack = LiveStack(f"http://127.0.0.1:{port}", live_stack.env, live_stack.worker, tmp_path)
        fx = make_agent(mode="standard")
        session = session_of(stack, fx)
        sock = connect(stack)
        sock.sendall(request_bytes(stack, fx, session, call(1, "nope", {})))
        [quick], _ = read_responses(sock, 1)
        assert quick.headers["content-type"] == "application/json"
        started = time.monotonic()
        sock.sendall(request_bytes(stack, fx, session, call(2)))
        [ended], left = read_responses(sock, 1)
        took = time.monotonic() - started
        sock.close()
        print(took, ended)
        assert ended.headers["content-type"] == "text/event-stream"
        assert ended.json_rpc() == []  # the stream ended by daphne, without an answer
        wait_slots_free(fx)
        held = wait_for_pending(session.split("~")[0], tool="client_tool")
        assert held.status == Status.PENDING_APPROVAL
        time.sleep(1)
    text = log.read_text(errors="replace")
    print(text[-1500:])
    assert "Traceback" not in text and "Exception inside application" not in text


# --- Accept as clients send it, on the wire ----------------------------------------------


ACCEPTS = {
    "json-only": [("Accept", "application/json")],
    "sse-only": [("Accept", "text/event-stream")],
    "split-json-first": [("Accept", "application/json"), ("Accept", "text/event-stream")],
    "split-sse-first": [("Accept", "text/event-stream"), ("Accept", "application/json")],
    "both-twice": [("Accept", "application/json, text/event-stream")] * 2,
    "star": [("Accept", "*/*")],
    "none": [],
}


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.parametrize("case", list(ACCEPTS))
def test_accept_variants_on_the_wire(live_stack: LiveStack, live_db: None, case: str) -> None:
    fx = make_agent(mode="standard")
    session = session_of(live_stack, fx)
    raw = request_bytes(live_stack, fx, session, call(7, "nope", {}))
    head, _, payload = raw.partition(b"\r\n\r\n")
    lines = [x for x in head.split(b"\r\n") if not x.lower().startswith(b"accept:")]
    lines += [f"{k}: {v}".encode() for k, v in ACCEPTS[case]]
    sock = connect(live_stack)
    sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + payload)
    [response], _ = read_responses(sock, 1)
    sock.close()
    print(case, response.status, response.headers.get("content-type"), response.body[:120])
    if response.status == 200:
        [message] = response.json_rpc()
        assert message["id"] == 7


@pytest.mark.live
@pytest.mark.slow
def test_forty_held_streams_ping_and_all_answer_well_framed(
    live_stack: LiveStack, live_db: None
) -> None:
    agents = [make_agent(mode="standard") for _ in range(5)]
    other = make_agent(mode="standard")
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))
    sessions = [session_of(live_stack, fx) for fx in agents]
    so = session_of(live_stack, other)
    before = len(daphne_log(live_stack))
    held: dict[socket.socket, int] = {}
    for k, (fx, session) in enumerate(zip(agents, sessions, strict=True)):
        for n in range(8):
            sock = connect(live_stack)
            sock.sendall(request_bytes(live_stack, fx, session, call(1000 * k + n)))
            held[sock] = 1000 * k + n
    deadline = time.monotonic() + 30
    while sum(limits.waits_held(fx.agent) for fx in agents) < 40:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # Another agent's calls stay quick (JSON) beside forty held streams.
    sock = connect(live_stack)
    slowest = 0.0
    for n in range(20):
        started = time.monotonic()
        sock.sendall(request_bytes(live_stack, other, so, call(n, f"nope{n}", {})))
        [quick], _ = read_responses(sock, 1)
        slowest = max(slowest, time.monotonic() - started)
        assert quick.headers["content-type"] == "application/json"
    sock.close()
    # Every held stream gets its first ping (15 s after its request, as the SDK's).
    time.sleep(16)
    buffers: dict[socket.socket, bytes] = {}
    for s in held:
        s.setblocking(False)
        buffers[s] = s.recv(65536)
        assert buffers[s].startswith(b"HTTP/1.1 200") and b": ping" in buffers[s]
        s.setblocking(True)
    waiting = ToolCall.objects.filter(session__agent__in=[fx.agent for fx in agents])
    pending = list(waiting.filter(status="pending_approval"))
    assert len(pending) == 40
    for c in pending:
        review(c, reviewer, approve=True)
    ids = []
    deadline = time.monotonic() + 30
    open_ = dict(held)
    while open_ and time.monotonic() < deadline:
        for s in select.select(list(open_), [], [], 0.5)[0]:
            chunk = s.recv(65536)
            buffers[s] += chunk
            if buffers[s].endswith(b"0\r\n\r\n") or not chunk:
                ids.append(open_.pop(s))
                s.close()
    assert not open_
    for s, data in buffers.items():
        assert data.count(b"HTTP/1.1 200") == 1 and data.count(b"event: message") == 1
        assert f'"id":{held[s]},'.encode() in data, data[-400:]
    assert slowest < 1.0, slowest
    for fx in agents:
        wait_slots_free(fx)
    assert_quiet(live_stack, before)


# --- the wire's silence while a call waits: no longer than the SDK's -----------------------


def test_a_held_call_is_never_silent_longer_than_the_sdks_ping_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """daphne (Twisted) writes a response's headers with its first body, so what a client
    (or a proxy's idle timeout) sees of a held call is its first ping. The SDK's stream
    (sse_starlette) pings DEFAULT_PING_INTERVAL seconds after the request began (15.01 s
    on a live daphne), and so did the fast path before its JSON window; with the window,
    the first ping came an interval after the window (16.02 s). The first ping now comes
    when the SDK's would, and each later one an interval after it."""
    import asyncio

    from sse_starlette import EventSourceResponse

    from dispatcher.gateways import mcp_fast

    interval, window, answer_at = 0.5, 0.2, 1.3
    monkeypatch.setattr(mcp_fast, "JSON_WITHIN", window)
    monkeypatch.setattr(EventSourceResponse, "DEFAULT_PING_INTERVAL", interval)
    message = '{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}'

    async def held(caller: Any, request: Any, early: Any = None) -> str:
        await asyncio.sleep(answer_at)
        return message

    monkeypatch.setattr(mcp_fast, "_message", held)

    async def exchange() -> list[tuple[float, dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        sent: list[tuple[float, dict[str, Any]]] = []

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()  # the client stays
            return {"type": "http.disconnect"}

        async def send(m: dict[str, Any]) -> None:
            sent.append((loop.time() - started, m))

        started = loop.time()
        await mcp_fast.serve(object(), None, receive, send, "s")  # type: ignore[arg-type]
        return sent

    sent = asyncio.run(exchange())
    assert sent[0][1]["type"] == "http.response.start"
    bodies = [t for t, m in sent if m["type"] == "http.response.body" and m["body"]]
    assert bodies[0] <= interval + 0.1, sent  # (0.7 s before: the window, then an interval)
    gaps = [b - a for a, b in zip(bodies, bodies[1:], strict=False)]
    assert all(gap <= interval + 0.1 for gap in gaps), sent
    assert sent[-2][1]["body"].startswith(b"event: message\r\ndata: ")
    assert sent[-1][1] == {"type": "http.response.body", "body": b"", "more_body": False}


# --- Codex (rmcp) as the MCP client ---------------------------------------------------------


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.client_program
def test_codex_reads_a_json_answer_and_a_held_calls_sse_answer(
    live_stack: LiveStack, live_db: None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real Codex CLI (its Rust MCP client) with Harness as an MCP server, against the
    fake Responses API: a quick call answered as one JSON body, then a permission prompt
    held for a reviewer past the window (answered on the SSE stream); Codex hands both
    answers to the model. (A model Codex does not know gets the server's tools as one
    namespace, not deferred behind tool_search; the fake model names the namespace.)"""
    from tests.support import fake_openai, processes
    from tests.support.paths import ROOT

    cli = ROOT / "var/codex/node_modules/.bin/codex"
    if not cli.exists():
        pytest.skip(f"needs the pinned Codex CLI at {cli}: `make codex`")
    original = fake_openai._item

    def item(step: Any) -> dict[str, Any]:
        out = original(step)
        if out.get("type") == "function_call" and "." in out["name"]:
            out["namespace"], out["name"] = out["name"].split(".")
        return out

    monkeypatch.setattr(fake_openai, "_item", item)
    fx = make_agent(mode="standard")
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))

    def approve() -> None:
        deadline = time.monotonic() + 90
        mine = ToolCall.objects.filter(session__agent=fx.agent, status="pending_approval")
        while (pending := mine.first()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pending is not None
        time.sleep(2.5)  # past the window: the answer goes on the SSE stream
        review(pending, reviewer, approve=True)

    home, project = tmp_path / "home" / ".codex", tmp_path / "project"
    home.mkdir(parents=True)
    project.mkdir()
    steps = [
        fake_openai.call("mcp__harness.list_directory", path="."),
        fake_openai.call("mcp__harness.approval_prompt", **PROMPT),
    ]
    thread = threading.Thread(target=approve, daemon=True)
    thread.start()
    with fake_openai.FakeOpenAI(steps) as fake:
        (home / "config.toml").write_text(
            'model = "gpt-4.1"\nmodel_provider = "fake"\ncheck_for_update_on_startup = false\n'
            f'\n[mcp_servers.harness]\nurl = "{live_stack.url}/mcp/"\n'
            'bearer_token_env_var = "HARNESS_TOKEN"\ntool_timeout_sec = 120\n'
            f'\n[model_providers.fake]\nname = "fake"\nbase_url = "{fake.url}"\n'
            'wire_api = "responses"\nenv_key = "FAKE_OPENAI_KEY"\n'
        )
        env = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": str(home.parent),
            "CODEX_HOME": str(home),
            "FAKE_OPENAI_KEY": "sk-test-not-a-key",
            "HARNESS_TOKEN": fx.token,
        }
        proc = processes.start(
            [str(cli), "exec", "--skip-git-repo-check"]
            + ["--dangerously-bypass-approvals-and-sandbox", "Do the task."],
            cwd=project,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, stderr = processes.finish(proc, 150)
        assert proc.returncode == 0, stderr[-3000:]
    thread.join(30)
    listed, decided = list(fake.tool_outputs().values())
    assert "(empty directory)" in listed, listed
    assert '\\"behavior\\": \\"allow\\"' in decided, decided


# --- the framing under random timing (in this process, daphne's rules on send) -----------


@pytest.mark.slow
def test_random_answer_hang_up_and_send_timings_keep_the_framing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Random answer times around the window, hang-ups, and sends that take a while (a
    slow client): nothing sent after a response's end, one start, a JSON body of the right
    length or an SSE stream of pings and one message that ends, and a whole answer to a
    client that stays; nothing left for the loop's exception handler."""
    import asyncio
    import random

    import anyio
    from sse_starlette import EventSourceResponse

    from dispatcher.gateways import mcp_fast

    monkeypatch.setattr(mcp_fast, "JSON_WITHIN", 0.05)
    monkeypatch.setattr(EventSourceResponse, "DEFAULT_PING_INTERVAL", 0.08)
    message = '{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}'

    async def trial(rng: random.Random) -> list[str]:
        answer_at = rng.choice([0.0, 0.049, 0.05, 0.051, rng.uniform(0, 0.2)])
        hang_up_at = rng.choice([None, None, 0.05, rng.uniform(0, 0.2)])
        send_delay = rng.choice([0.0, rng.uniform(0, 0.04)])
        shielded = rng.random() < 0.3  # a handler that finishes despite the hang-up
        hung = asyncio.Event()
        sent: list[dict[str, Any]] = []
        problems: list[str] = []

        async def answer(caller: Any, request: Any, early: Any = None) -> str:
            with anyio.CancelScope(shield=shielded):
                await asyncio.sleep(answer_at)
            return message

        monkeypatch.setattr(mcp_fast, "_message", answer)

        async def receive() -> dict[str, Any]:
            if hang_up_at is None:
                await asyncio.Event().wait()
            await asyncio.sleep(hang_up_at or 0)
            hung.set()
            return {"type": "http.disconnect"}

        async def send(m: dict[str, Any]) -> None:
            await asyncio.sleep(send_delay * rng.random())
            if hung.is_set():
                return  # daphne drops what is sent to a connection that is gone
            if sent and sent[-1]["type"] == "http.response.body" and not sent[-1]["more_body"]:
                problems.append(f"sent after the end: {m}")
            if (m["type"] == "http.response.start") == bool(sent):
                problems.append(f"start out of place: {m}")
            sent.append({"more_body": False, **m})

        await asyncio.wait_for(mcp_fast.serve(object(), None, receive, send, "s"), 5)  # type: ignore[arg-type]
        await asyncio.sleep(0.1)  # whatever the watcher had left
        if not sent:
            return problems if hung.is_set() else [*problems, "nothing sent to a client there"]
        headers = dict(sent[0]["headers"])
        bodies = [m["body"] for m in sent[1:]]
        ended = not sent[-1]["more_body"]
        if headers[b"content-type"] == b"application/json":
            body = message.encode()
            if bodies != [body] or headers[b"content-length"] != str(len(body)).encode():
                problems.append(f"JSON answer {sent}")
        else:
            events = [b for b in bodies if b and not b.startswith(b": ping")]
            if len(events) > 1 or any(not e.startswith(b"event: message\r\n") for e in events):
                problems.append(f"SSE answer {sent}")
            if not hung.is_set() and (len(events) != 1 or not ended):
                problems.append(f"SSE answer unfinished {sent}")
        return problems

    async def trials() -> tuple[list[str], list[Any]]:
        errors: list[Any] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: errors.append(ctx))
        rng = random.Random(37)
        found = [p for _ in range(150) for p in await trial(rng)]
        return found, errors

    found, errors = asyncio.run(trials())
    assert found == [] and errors == []
