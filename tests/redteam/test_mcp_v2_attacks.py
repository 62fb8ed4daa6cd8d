"""Red-team attacks on the MCP gateway's 2026-07-28 revision (dispatcher/gateways/mcp_http.py
serve_modern, dispatcher/gateways/mcp.py hold/cancel_closed) and the outbound door's
httpx2 client (floor/outbound.py async_client), against a live Harness: another agent's
session and run key, header spoofing, batches, huge bodies, the caps, cancelling by
closing the stream, and addresses the door must never reach."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from django.conf import settings

from audit import kinds
from audit.models import AuditEvent
from dispatcher.models import AgentSession, Status, ToolCall
from floor import outbound
from floor.outbound import OutboundRefused
from tests.approvals.conftest import closing_connections
from tests.mcp.conftest import review, run
from tests.support import mcp_requests
from tests.support.factories import AgentFixture, make_agent, make_user, unique
from tests.support.live import LiveStack

pytestmark = pytest.mark.live

MODERN = "2026-07-28"
ACCEPT = "application/json, text/event-stream"


def envelope(run_key: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "red", "version": "1"},
    }
    if run_key:
        meta["harness/run"] = run_key
    return meta


def modern_body(n: int, method: str, params: dict[str, Any], run_key: str = "") -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": n,
        "method": method,
        "params": {**params, "_meta": envelope(run_key)},
    }


def modern_headers(fx: AgentFixture | None, method: str, name: str = "") -> dict[str, str]:
    headers = {"Accept": ACCEPT, "MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    if name:
        headers["Mcp-Name"] = name
    if fx is not None:
        headers["Authorization"] = f"Bearer {fx.token}"
    return headers


def post(stack: LiveStack, body: Any, headers: Any, timeout: float = 60) -> httpx.Response:
    return httpx.post(stack.url + "/mcp/", json=body, headers=headers, timeout=timeout)


def modern_call(
    stack: LiveStack,
    fx: AgentFixture,
    n: int,
    name: str,
    arguments: dict[str, Any],
    run_key: str = "",
    session: str = "",
) -> httpx.Response:
    headers = modern_headers(fx, "tools/call", name)
    if session:
        headers["Mcp-Session-Id"] = session
    body = modern_body(n, "tools/call", {"name": name, "arguments": arguments}, run_key)
    return post(stack, body, headers)


def initialize(stack: LiveStack, fx: AgentFixture) -> str:
    body = mcp_requests.initialize("red-init", version="2025-11-25", request_id=1)
    answer = post(stack, body, {"Accept": ACCEPT, "Authorization": f"Bearer {fx.token}"})
    assert answer.status_code == 200, answer.text
    return answer.headers["mcp-session-id"]


# --- 1. authentication, sessions, run keys, header spoofing, batches, bodies, caps --------


def test_a_modern_request_without_a_good_token_is_refused_before_anything(
    live_stack: LiveStack, live_db: None
) -> None:
    body = modern_body(1, "tools/call", {"name": "read_file", "arguments": {"path": "x"}})
    for auth in ({}, {"Authorization": "Bearer hrn_nope_nope"}, {"Authorization": "Basic x"}):
        answer = post(live_stack, body, {**modern_headers(None, "tools/call", "read_file"), **auth})
        assert answer.status_code == 401, answer.text
        assert answer.headers["www-authenticate"].startswith("Bearer")
    discover = modern_body(2, "server/discover", {})
    answer = post(live_stack, discover, modern_headers(None, "server/discover"))
    assert answer.status_code == 401, answer.text


def test_another_agents_session_id_or_run_key_reaches_nothing_of_its_run(
    live_stack: LiveStack, live_db: None
) -> None:
    victim, thief = make_agent(mode="trusted"), make_agent(mode="trusted")
    written = modern_call(
        live_stack, victim, 1, "write_file", {"path": "secret.txt", "content": "k"}, "run-v"
    )
    assert written.status_code == 200, written.text
    [run_session] = AgentSession.objects.filter(agent=victim.agent, client="mcp")
    sid = initialize(live_stack, victim)
    # The victim's Mcp-Session-Id (whole, or its run's external id) on a modern request.
    for session in (sid, run_session.external_id, "run:run-v"):
        answer = modern_call(
            live_stack, thief, 2, "read_file", {"path": "secret.txt"}, session=session
        )
        assert answer.status_code == 404, (session, answer.text)
    # The victim's run key in _meta: the thief's own run of that key, not the victim's.
    answer = modern_call(live_stack, thief, 3, "read_file", {"path": "secret.txt"}, "run-v")
    assert answer.status_code == 200, answer.text
    assert "secret" not in answer.text.replace("secret.txt", "") and "does not exist" in answer.text
    [own] = AgentSession.objects.filter(agent=thief.agent, client="mcp")
    assert own.pk != run_session.pk and own.workspace != run_session.workspace
    assert ToolCall.objects.filter(session=run_session).count() == 1


def test_batches_duplicated_headers_and_huge_bodies_record_no_call(
    live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="trusted")
    sid = initialize(live_stack, fx)
    calls = [
        modern_body(
            n, "tools/call", {"name": "write_file", "arguments": {"path": f"b{n}", "content": "x"}}
        )
        for n in range(1, 4)
    ]
    # A batch (JSON array) with the agent's own session, in either era.
    for version in (MODERN, "2025-11-25", "2025-03-26"):
        headers = {**modern_headers(fx, "tools/call", "write_file"), "Mcp-Session-Id": sid}
        headers["MCP-Protocol-Version"] = version
        answer = post(live_stack, calls, headers)
        assert answer.status_code >= 400 or "error" in answer.text, (version, answer.text)
        assert "Traceback" not in answer.text
    # The routing header twice, the modern one first (the SDK's rule: refused).
    twice = [
        *modern_headers(fx, "tools/call", "write_file").items(),
        ("mcp-protocol-version", "2025-11-25"),
    ]
    answer = post(live_stack, calls[0], twice)
    assert answer.status_code == 400, answer.text
    # An unserved version, lower case, padded.
    for version in ("2099-01-01", "2026-07-28, 2025-11-25"):
        headers = {
            **modern_headers(fx, "tools/call", "write_file"),
            "mcp-protocol-version": version,
        }
        del headers["MCP-Protocol-Version"]
        answer = post(live_stack, calls[0], headers)
        assert answer.status_code == 400, (version, answer.text)
        assert "Traceback" not in answer.text
    # A body past HARNESS_MAX_BODY_BYTES.
    huge = modern_body(
        9,
        "tools/call",
        {
            "name": "write_file",
            "arguments": {"path": "h", "content": "x" * settings.HARNESS_MAX_BODY_BYTES},
        },
    )
    answer = post(live_stack, huge, modern_headers(fx, "tools/call", "write_file"))
    assert answer.status_code == 413, answer.text
    assert not ToolCall.objects.filter(session__agent=fx.agent).exists()


def test_a_listen_stream_is_not_held_open_past_the_caps(
    live_stack: LiveStack, live_db: None
) -> None:
    """subscriptions/listen is a stream that never ends by itself: Harness serves none
    (it would hold a connection outside every wait cap)."""
    fx = make_agent(mode="trusted")
    body = modern_body(1, "subscriptions/listen", {"notifications": {}})
    started = time.monotonic()
    answer = post(live_stack, body, modern_headers(fx, "subscriptions/listen"), timeout=20)
    assert time.monotonic() - started < 10
    assert answer.status_code in (400, 404), answer.text
    assert "Traceback" not in answer.text


def test_new_runs_by_run_key_are_capped_per_minute(live_stack: LiveStack, live_db: None) -> None:
    # The cap counts per calendar minute: a try that ran into the next minute (a loaded
    # machine) is not a test of it, and starts again with a new agent.
    for _ in range(3):
        fx = make_agent(mode="trusted")
        minute = int(time.time() // 60)
        statuses: list[int] = []
        for n in range(settings.HARNESS_MAX_SESSIONS_PER_MINUTE + 2):
            answer = post(
                live_stack,
                modern_body(n + 1, "server/discover", {}, run_key=f"key-{n}"),
                modern_headers(fx, "server/discover"),
            )
            statuses.append(answer.status_code)
            if answer.status_code == 429:
                assert "retry-after" in answer.headers
                break
            time.sleep(0.06)  # (under the agent's request rate)
        if statuses[-1] == 429 or int(time.time() // 60) == minute:
            break
    assert statuses[-1] == 429, statuses
    sessions = AgentSession.objects.filter(agent=fx.agent).count()
    assert sessions <= settings.HARNESS_MAX_SESSIONS_PER_MINUTE


# --- 2. cancelling by closing the stream ---------------------------------------------------


def _pending(fx: AgentFixture, count: int = 1, seconds: float = 20) -> list[ToolCall]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = list(
            ToolCall.objects.filter(session__agent=fx.agent, status=Status.PENDING_APPROVAL)
        )
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} pending calls")


async def _in_thread[T](function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`function` in one of anyio's worker threads, which end with the scenario's loop: its
    database connection is given back when it returns (a thread that ends holding one
    never gives it back to the pool)."""
    call = closing_connections(functools.partial(function, *args, **kwargs))
    return await anyio.to_thread.run_sync(call)


def _settle(call: ToolCall, seconds: float = 20) -> ToolCall:
    deadline = time.monotonic() + seconds
    call.refresh_from_db()
    while not call.is_terminal and time.monotonic() < deadline:
        time.sleep(0.05)
        call.refresh_from_db()
    return call


def test_closing_after_the_approval_neither_cancels_nor_reruns_the_call(
    live_stack: LiveStack, live_db: None
) -> None:
    fx = make_agent(mode="standard")
    reviewer = make_user(unique("reviewer"), groups=("reviewer",))

    async def scenario() -> ToolCall:
        headers = modern_headers(fx, "tools/call", "write_file")
        body = modern_body(
            1,
            "tools/call",
            {"name": "write_file", "arguments": {"path": "once.txt", "content": "1\n"}},
        )
        async with (
            httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=120)) as http,
            anyio.create_task_group() as group,
        ):
            group.start_soon(
                functools.partial(http.post, live_stack.url + "/mcp/", json=body, headers=headers)
            )
            [call] = await _in_thread(_pending, fx)
            await _in_thread(review, call, reviewer, approve=True)
            group.cancel_scope.cancel()  # closed just after the approval
        return call

    call = _settle(run(scenario))
    assert call.status == Status.COMPLETED, (call.status, call.content)
    events = AuditEvent.objects.filter(subject=f"call:{call.pk}")
    names = [e.kind for e in events]
    assert kinds.CALL_CANCELLED not in names, names
    assert names.count(kinds.CALL_APPROVED) <= 1, names
    from pathlib import Path

    assert (Path(call.session.workspace) / "once.txt").read_text() == "1\n"


def test_closed_streams_give_their_wait_slots_back_and_cancel_only_their_own_calls(
    live_stack: LiveStack, live_db: None
) -> None:
    fx, other = make_agent(mode="standard"), make_agent(mode="standard")
    limit = settings.HARNESS_MAX_WAITS_PER_AGENT

    # The other agent's pending call: it must stay pending.
    async def others() -> None:
        headers = modern_headers(other, "tools/call", "write_file")
        body = modern_body(
            1, "tools/call", {"name": "write_file", "arguments": {"path": "o.txt", "content": "o"}}
        )
        async with (
            httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=120)) as http,
            anyio.create_task_group() as group,
        ):
            group.start_soon(
                functools.partial(http.post, live_stack.url + "/mcp/", json=body, headers=headers)
            )
            await _in_thread(_pending, other)
            # (the other agent keeps its stream open until the end of this scenario)
            await anyio.to_thread.run_sync(held.wait, 60)
            group.cancel_scope.cancel()

    held = threading.Event()
    thread = threading.Thread(target=run, args=(others, 120), daemon=True)
    thread.start()
    [their] = _pending(other)

    async def scenario() -> tuple[int, str]:
        async with (
            httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=120)) as http,
            anyio.create_task_group() as group,
        ):
            for n in range(limit):
                body = modern_body(
                    n + 1,
                    "tools/call",
                    {"name": "write_file", "arguments": {"path": f"w{n}", "content": "x"}},
                )
                headers = modern_headers(fx, "tools/call", "write_file")
                group.start_soon(
                    functools.partial(
                        http.post, live_stack.url + "/mcp/", json=body, headers=headers
                    )
                )
            await _in_thread(_pending, fx, limit)
            extra = modern_body(
                99,
                "tools/call",
                {"name": "write_file", "arguments": {"path": "x", "content": "x"}},
            )
            refused = await http.post(
                live_stack.url + "/mcp/",
                json=extra,
                headers=modern_headers(fx, "tools/call", "write_file"),
            )
            group.cancel_scope.cancel()
        return refused.status_code, refused.text

    status, text = run(scenario)
    assert "retry" in text.lower() or status == 429, (status, text)
    deadline = time.monotonic() + 20
    while (
        ToolCall.objects.filter(session__agent=fx.agent, status=Status.PENDING_APPROVAL).exists()
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    mine = ToolCall.objects.filter(session__agent=fx.agent)
    assert {c.status for c in mine} == {Status.CANCELLED}
    assert all(c.decided_by == f"agent:{fx.agent.name}" for c in mine)
    cancelled = AuditEvent.objects.filter(
        kind=kinds.CALL_CANCELLED, subject__in=[f"call:{c.pk}" for c in mine]
    )
    assert cancelled.count() == limit
    # Every slot came back: a new call is admitted (and held), not refused.
    again = modern_call(live_stack, fx, 200, "read_file", {"path": "w0"})
    assert again.status_code == 200 and "too many" not in again.text.lower(), again.text
    their.refresh_from_db()
    assert their.status == Status.PENDING_APPROVAL
    held.set()
    thread.join(60)


# --- 3. the outbound door on httpx2 --------------------------------------------------------


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "localhost", "2130706433", "0x7f000001", "127.1", "[::1]", "[::ffff:127.0.0.1]"],
)
def test_the_httpx2_client_never_reaches_a_loopback_listener(settings: Any, host: str) -> None:
    from tests.dispatcher.test_outbound import listener

    settings.HARNESS_OUTBOUND_ALLOW = []

    async def fetch(url: str) -> int:
        async with outbound.async_client(timeout=5) as client:
            return (await client.post(url, json={})).status_code

    with listener() as target, pytest.raises((OutboundRefused, httpx2.HTTPError)):
        anyio.run(fetch, f"http://{host}:{target.port}/mcp")
    assert target.hits == []


@pytest.mark.backend_independent
def test_the_httpx2_client_follows_no_redirect_even_when_asked(settings: Any) -> None:
    from tests.dispatcher.test_outbound import listener

    settings.HARNESS_OUTBOUND_ALLOW = []

    async def fetch(url: str) -> int:
        async with outbound.async_client(timeout=5) as client:
            return (await client.get(url, follow_redirects=True)).status_code

    with listener() as target, listener("redirect", location=target.url) as hop:
        settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{hop.port}"]
        with pytest.raises(OutboundRefused):
            anyio.run(fetch, hop.url)
    assert target.hits == []


@pytest.mark.backend_independent
@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd", "deflate", "identity, gzip", "GZIP "])
def test_the_httpx2_client_refuses_every_compressed_answer(settings: Any, encoding: str) -> None:
    import gzip
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    bomb = gzip.compress(b"\0" * (4 * 1024 * 1024))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Encoding", encoding)
            self.send_header("Content-Length", str(len(bomb)))
            self.end_headers()
            self.wfile.write(bomb)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{server.server_port}"]

    async def fetch() -> int:
        async with outbound.async_client(limit=1024 * 1024, timeout=10) as client:
            return len((await client.get(f"http://127.0.0.1:{server.server_port}/")).content)

    try:
        with pytest.raises(OutboundRefused):
            anyio.run(fetch)
    finally:
        server.shutdown()
        server.server_close()


# --- 4. an upstream server's errors and malformed results ----------------------------------

OUTPUT_SCHEMA = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
BAD_RESULTS: dict[str, Any] = {
    "junk": {"content": "not a list of blocks"},
    "wrong_structure": {"content": [], "structuredContent": {"x": 1}},
    "no_structure": {"content": [{"type": "text", "text": "plain"}]},
    "input_required": {"resultType": "input_required", "inputRequests": {}},
    "rpc_error": None,  # a JSON-RPC error instead of a result
    "not_json": None,  # a 200 whose body is not JSON
}


@contextmanager
def bad_upstream() -> Iterator[int]:
    """A Streamable HTTP MCP server on 127.0.0.1 (JSON answers) whose tools answer
    malformed results (BAD_RESULTS)."""
    import json as json_module
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    tools = [
        {
            "name": name,
            "inputSchema": {"type": "object"},
            **({"outputSchema": OUTPUT_SCHEMA} if "structure" in name else {}),
        }
        for name in BAD_RESULTS
    ]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            message = json_module.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if "id" not in message:
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            method, params = message["method"], message.get("params") or {}
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
            raw = b""
            if method == "initialize":
                reply["result"] = {
                    "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "bad", "version": "1"},
                }
            elif method == "tools/list":
                reply["result"] = {"tools": tools}
            elif method == "tools/call" and params["name"] == "rpc_error":
                reply["error"] = {"code": -32603, "message": "the upstream broke"}
            elif method == "tools/call" and params["name"] == "not_json":
                raw = b"<html>oops</html>"
            elif method == "tools/call":
                reply["result"] = BAD_RESULTS[params["name"]]
            else:
                reply["error"] = {"code": -32601, "message": "Method not found"}
            body = raw or json_module.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_DELETE(self) -> None:  # noqa: N802
            self.send_response(405)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_DELETE  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.backend_independent
@pytest.mark.parametrize("tool", list(BAD_RESULTS))
def test_an_upstream_error_or_malformed_result_reaches_the_model_as_an_error(
    settings: Any, tmp_path: Any, tool: str
) -> None:
    from dispatcher.tools.base import ExecutionContext, ToolError
    from dispatcher.tools.sources import services, upstream

    with bad_upstream() as port:
        settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{port}"]
        endpoint = upstream.Endpoint(
            server_id=9_000_000 + port,
            version=1,
            name="bad",
            transport="http",
            url=f"http://127.0.0.1:{port}/mcp",
            timeout=10,
        )
        [definition] = [d for d in upstream.list_definitions(endpoint) if d.name == tool]
        ctx = ExecutionContext(workspace=tmp_path, call_id="c1", timeout=10, output_limit=4000)
        with pytest.raises(ToolError) as error:
            services.run_tool(endpoint, tool, definition.fingerprint, ctx, {})
    text = str(error.value)
    assert "'bad'" in text, text  # names the server, as every upstream failure does
    assert f"could not run '{tool}'" in text, text  # the server's failure, not an internal one
    assert ". Try again later" in text and ".. " not in text, text  # (one sentence, one stop)
    assert "Traceback" not in text, text
    assert len(text) <= 4000, text


@pytest.mark.backend_independent
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "127.1"])
def test_an_upstream_server_on_loopback_not_allowed_is_never_reached_by_the_v2_client(
    settings: Any, host: str
) -> None:
    from dispatcher.tools.sources import upstream

    with bad_upstream() as port:
        settings.HARNESS_OUTBOUND_ALLOW = []
        endpoint = upstream.Endpoint(
            server_id=8_000_000 + port,
            version=1,
            name="bad",
            transport="http",
            url=f"http://{host}:{port}/mcp",
            timeout=5,
        )
        with pytest.raises(upstream.UpstreamError, match="outbound policy"):
            upstream.list_definitions(endpoint)


def test_a_stream_closed_while_its_call_is_being_admitted_leaves_no_pending_call(
    live_stack: LiveStack, live_db: None
) -> None:
    """A 2026-07-28 client that gives up at once (closes right after sending) cancels its
    call too: a call admitted after the close must not wait for a reviewer whom nobody
    answers to, to run later for a client that is gone."""
    import json as json_module
    import socket
    from urllib.parse import urlsplit

    fx = make_agent(mode="standard")
    where = urlsplit(live_stack.url)
    for n, delay in enumerate((0.0, 0.02, 0.05, 0.1, 0.2, 0.3)):
        body = json_module.dumps(
            modern_body(
                n + 1,
                "tools/call",
                {"name": "write_file", "arguments": {"path": f"gone{n}.txt", "content": "x"}},
            )
        ).encode()
        headers = {
            **modern_headers(fx, "tools/call", "write_file"),
            "Host": where.netloc,
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
        }
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        with socket.create_connection((where.hostname, where.port)) as sock:
            sock.sendall(f"POST /mcp/ HTTP/1.1\r\n{head}\r\n".encode() + body)
            time.sleep(delay)
    deadline = time.monotonic() + 20
    calls = list(ToolCall.objects.filter(session__agent=fx.agent))
    while time.monotonic() < deadline and (
        len(calls) < 6 or any(c.status == Status.PENDING_APPROVAL for c in calls)
    ):
        time.sleep(0.2)
        calls = list(ToolCall.objects.filter(session__agent=fx.agent))
    left = [(c.tool_use_id, c.status) for c in calls if c.status == Status.PENDING_APPROVAL]
    assert not left, left
