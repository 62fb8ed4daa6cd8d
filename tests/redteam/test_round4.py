"""Red-team, round 4: attacks on perf37 (02dab83 and after): the outbound door keeps an MCP
session's HTTP connection for its next request, reading the rest of an answer the MCP
client stopped reading (floor/outbound.py, DRAIN_SECONDS, DRAIN_BYTES, KEEPALIVE_SECONDS),
and the MCP gateway takes the agent's request rate on the same trip as its token's read
(dispatcher/gateways/mcp_http.py, authenticate_and_count). Each test is an attack; it
passes when the attack fails. The upstreams are real HTTP servers on 127.0.0.1 speaking
raw HTTP/1.1, so they can send what no well-behaved server does."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any

import anyio
import pytest
import trustme
from django.utils import timezone
from oauth2_provider.models import AccessToken
from starlette.types import Message

from agentauth.models import AgentToken
from dispatcher import agents, limits
from dispatcher.gateways import mcp
from dispatcher.gateways.mcp_http import application, authenticate_and_count
from floor import outbound
from tests.support.factories import AgentFixture, make_agent

# --- Upstreams that misbehave on purpose -------------------------------------------------

# What an answer handler gets: the request's number (1, 2, ... across connections), its
# head, and the socket to write whatever it likes to; it returns False to hang up.
Handler = Callable[[int, bytes, socket.socket], bool]


class Upstream:
    """A raw HTTP/1.1 server on 127.0.0.1: each request is read whole (head and
    Content-Length body) and handed to `handler`; `connections` counts the connections it
    accepted, `heads` the request heads it read, each with its connection's number."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}/mcp"
        self.connections = 0
        self.heads: list[tuple[int, bytes]] = []
        self.stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._sockets.append(conn)
                number = self.connections
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        buffer = b""
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
                with self._lock:
                    self._sockets.append(conn)
            while not self.stop.is_set():
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buffer) < length:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                buffer = buffer[length:]
                with self._lock:
                    self.heads.append((number, head))
                    request = len(self.heads)
                if not self.handler(request, head, conn):
                    return
        except OSError:
            return
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        with self._lock:
            for conn in self._sockets:
                with suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()


@contextmanager
def upstream(handler: Handler, tls: ssl.SSLContext | None = None) -> Iterator[Upstream]:
    server = Upstream(handler, tls)
    try:
        yield server
    finally:
        server.close()


def json_answer(body: bytes, *, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s%s" % (len(body), body, extra)
    )


def chunked_answer(body: bytes, *, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked"
        b"\r\n\r\n%x\r\n%s\r\n0\r\n\r\n%s" % (len(body), body, extra)
    )


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(n: int) -> bytes:
    return b'event: message\ndata: {"jsonrpc": "2.0", "id": 1, "result": {"n": %d}}\n\n' % n


SMUGGLED = json_answer(b'{"smuggled": true}')


def numbered(n: int) -> bytes:
    return b'{"n": %d}' % n


def allow(settings: Any, *servers: Upstream) -> None:
    settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{server.port}" for server in servers]


async def first_event(client: Any, url: str) -> bytes:
    """POST and read up to the first SSE event, then close, as the MCP SDK reads an SSE
    answer (the door reads the rest, if it ends soon)."""
    async with client.stream("POST", url, json={"jsonrpc": "2.0", "id": 1}) as response:
        async for piece in response.aiter_bytes():
            await response.aclose()
            return bytes(piece)
    return b""


def burst(conn: socket.socket, *pieces: bytes) -> None:
    """`pieces` written one after the other (over TLS, each in records of its own) and
    sent together: the client receives them in one read."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
    for piece in pieces:
        conn.sendall(piece)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)


def answered_by(framing: str) -> Handler:
    """The first request's answer followed, in the same burst, by a whole second answer
    no request asked for; every later request gets its own numbered answer."""

    def handler(n: int, head: bytes, conn: socket.socket) -> bool:
        if n > 1:
            conn.sendall(json_answer(numbered(n)))
        elif framing == "length":
            burst(conn, json_answer(numbered(1)), SMUGGLED)
        elif framing == "chunked":
            burst(conn, chunked_answer(numbered(1)), SMUGGLED)
        else:  # an SSE answer: its event, then (once the client has it) its end
            conn.sendall(SSE_HEAD + chunk(event(1)))
            time.sleep(0.05)
            burst(conn, b"0\r\n\r\n", SMUGGLED)
        return True

    return handler


@pytest.fixture(scope="module")
def certificate_authority() -> trustme.CA:
    return trustme.CA()


def tls_server(ca: trustme.CA, tmp_path: Any, settings: Any) -> ssl.SSLContext:
    """A server context with a certificate for 127.0.0.1 that the door trusts."""
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    settings.HARNESS_OUTBOUND_CA_FILE = str(ca_file)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("framing", ["length", "chunked", "sse"])
def test_an_answer_queued_behind_another_never_answers_the_next_request(
    settings: Any, framing: str, scheme: str, certificate_authority: trustme.CA, tmp_path: Any
) -> None:
    """A server (or a desynchronised proxy in front of it) writes a second answer right
    behind the first: the next request on the kept connection must not take it as its
    own (HTTP response queue poisoning), nor each later one its predecessor's. The bytes
    left after an answer's end retire its connection: read already, or (over TLS) in a
    record of their own not yet decrypted."""
    tls = tls_server(certificate_authority, tmp_path, settings) if scheme == "https" else None

    async def attack(url: str) -> list[bytes]:
        async with outbound.async_client(timeout=5) as client:
            if framing == "sse":
                assert b'"n": 1' in await first_event(client, url)
            else:
                assert (await client.post(url, json={})).content == numbered(1)
            return [(await client.post(url, json={})).content for _ in range(2)]

    with upstream(answered_by(framing), tls) as server:
        allow(settings, server)
        answers = anyio.run(attack, server.url)
    assert answers == [numbered(2), numbered(3)]


def test_a_body_longer_than_its_content_length_does_not_break_the_next_call(
    settings: Any,
) -> None:
    """A server that counts characters, not bytes, in Content-Length leaves the rest of its
    body on the connection: the next call must not read it as its answer's head."""

    def handler(n: int, head: bytes, conn: socket.socket) -> bool:
        body = '{"text": "héllo wörld"}'.encode()
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body.decode()), body)
        )
        return True

    async def calls(url: str) -> list[int]:
        async with outbound.async_client(timeout=5) as client:
            return [(await client.post(url, json={})).status_code for _ in range(3)]

    with upstream(handler) as server:
        allow(settings, server)
        assert anyio.run(calls, server.url) == [200, 200, 200]


def test_an_answer_sent_to_an_idle_kept_connection_is_not_the_next_ones(settings: Any) -> None:
    """The unasked answer arrives after the first answer, while the connection waits idle
    in the pool: the next request goes on a new connection and gets its own answer."""
    sent = threading.Event()

    def handler(n: int, head: bytes, conn: socket.socket) -> bool:
        conn.sendall(json_answer(numbered(n)))
        if n == 1:
            time.sleep(0.05)
            conn.sendall(SMUGGLED)
            sent.set()
        return True

    async def attack(url: str) -> list[bytes]:
        async with outbound.async_client(timeout=5) as client:
            first = (await client.post(url, json={})).content
            await anyio.to_thread.run_sync(sent.wait, 5)
            await anyio.sleep(0.05)  # (the bytes cross the loopback)
            return [first, (await client.post(url, json={})).content]

    with upstream(handler) as server:
        allow(settings, server)
        assert anyio.run(attack, server.url) == [numbered(1), numbered(2)]
        assert server.connections == 2


def test_an_answer_of_one_server_never_answers_a_request_to_another(settings: Any) -> None:
    """One client, two servers: the first queues an unasked answer on its connection; a
    request to the second server is never given it (a connection serves one origin)."""

    def other(n: int, head: bytes, conn: socket.socket) -> bool:
        conn.sendall(json_answer(b'{"server": "b"}'))
        return True

    async def attack(a: str, b: str) -> list[bytes]:
        async with outbound.async_client(timeout=5) as client:
            await client.post(a, json={})
            return [(await client.post(b, json={})).content for _ in range(2)]

    with upstream(answered_by("length")) as first, upstream(other) as second:
        allow(settings, first, second)
        assert anyio.run(attack, first.url, second.url) == [b'{"server": "b"}'] * 2


def plain(n: int, head: bytes, conn: socket.socket) -> bool:
    conn.sendall(json_answer(numbered(n)))
    return True


def test_a_kept_connection_to_an_allowed_server_carries_no_request_to_another(
    settings: Any,
) -> None:
    """A connection kept to an allowed server is no way to another destination: another
    port of the same address (not allowed) is refused, with or without a Host header
    naming the allowed one, and a Host header naming the other port on a request to the
    allowed one still goes to the allowed one."""

    async def attack(allowed: Upstream, refused: Upstream) -> list[str]:
        outcomes = []
        async with outbound.async_client(timeout=5) as client:
            assert (await client.post(allowed.url, json={})).status_code == 200
            for headers in ({}, {"Host": f"127.0.0.1:{allowed.port}"}):
                try:
                    await client.post(refused.url, json={}, headers=headers)
                    outcomes.append("reached")
                except outbound.OutboundRefused as exc:
                    outcomes.append(str(exc))
            tricked = await client.post(
                allowed.url, json={}, headers={"Host": f"127.0.0.1:{refused.port}"}
            )
            assert tricked.status_code == 200
        return outcomes

    with upstream(plain) as allowed, upstream(plain) as refused:
        allow(settings, allowed)
        outcomes = anyio.run(attack, allowed, refused)
        assert outcomes == ["refused: a loopback address (127.0.0.1)"] * 2
        assert refused.heads == []
        assert len(allowed.heads) == 2
        assert allowed.connections == 1


def test_a_kept_connection_is_checked_again_once_idle_past_its_keepalive(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy is checked when a connection is made: a connection kept idle past
    KEEPALIVE_SECONDS is not reused, so a destination the allowance no longer names is
    refused then (not on a connection kept for ever)."""
    monkeypatch.setattr(outbound, "KEEPALIVE_SECONDS", 0.2)

    async def attack(url: str) -> str:
        async with outbound.async_client(timeout=5) as client:
            assert (await client.post(url, json={})).status_code == 200
            settings.HARNESS_OUTBOUND_ALLOW = []
            await anyio.sleep(0.4)
            try:
                await client.post(url, json={})
            except outbound.OutboundRefused as exc:
                return str(exc)
            return "reached"

    with upstream(plain) as server:
        allow(settings, server)
        assert anyio.run(attack, server.url) == "refused: a loopback address (127.0.0.1)"
        assert len(server.heads) == 1


def sse_then(rest: Callable[[socket.socket, threading.Event], None]) -> Handler:
    """The first request: one SSE event, then `rest` (until the server stops); every later
    request a numbered JSON answer."""

    def handler(n: int, head: bytes, conn: socket.socket) -> bool:
        if n > 1:
            conn.sendall(json_answer(numbered(n)))
            return True
        conn.sendall(SSE_HEAD + chunk(event(1)))
        stop = threading.Event()
        rest(conn, stop)
        return False

    return handler


def drip(conn: socket.socket, stop: threading.Event) -> None:
    """A comment line a byte at a time, every 20 ms, for ever: each read well within any
    read timeout."""
    while not stop.wait(0.02):
        conn.sendall(chunk(b":"))


def flood(conn: socket.socket, stop: threading.Event) -> None:
    """Comment lines as fast as the client reads them, for ever."""
    line = chunk(b":" + b"x" * 8190 + b"\n")
    while True:
        conn.sendall(line)


def closes_and_next(url: str, limit: int | None = None) -> tuple[float, bytes]:
    """How long closing the first (SSE) answer took, and the next request's answer."""

    async def run() -> tuple[float, bytes]:
        async with outbound.async_client(limit=limit, timeout=30) as client:
            async with client.stream("POST", url, json={}) as response:
                async for _piece in response.aiter_bytes():
                    break
                started = time.monotonic()
                await response.aclose()
                took = time.monotonic() - started
            return took, (await client.post(url, json={})).content

    return anyio.run(run)


@pytest.mark.parametrize("rest", [drip, flood], ids=["drip", "flood"])
def test_an_answer_that_never_ends_holds_its_close_no_longer_than_the_drain(
    settings: Any, rest: Callable[[socket.socket, threading.Event], None]
) -> None:
    """An SSE answer that goes on for ever (a byte at a time, or as fast as it can): its
    close returns within DRAIN_SECONDS (plus a loaded machine's slack), not after the
    read timeout (30 s here) or never, and its connection is not reused."""
    with upstream(sse_then(rest)) as server:
        allow(settings, server)
        took, answer = closes_and_next(server.url)
        assert took < outbound.DRAIN_SECONDS + 2, took
        assert answer == numbered(2)
        assert server.connections == 2


def test_the_drain_reads_no_further_than_the_answers_cap(settings: Any) -> None:
    """The rest of the answer goes past its cap (but is within DRAIN_BYTES): it is cut
    there, and the connection closed, not read to its end and reused."""
    cap = 32 << 10

    def rest(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(chunk(b":" + b"x" * (cap + (8 << 10)) + b"\n") + b"0\r\n\r\n")
        stop.wait(5)

    assert cap + (8 << 10) < outbound.DRAIN_BYTES
    with upstream(sse_then(rest)) as server:
        allow(settings, server)
        _took, answer = closes_and_next(server.url, limit=cap)
        assert answer == numbered(2)
        assert server.connections == 2


def test_the_drain_reads_no_further_than_drain_bytes(settings: Any) -> None:
    """The rest is more than DRAIN_BYTES, all sent at once with its end: it is not read to
    its end (the connection is closed)."""

    def rest(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(chunk(b":" + b"x" * (4 * outbound.DRAIN_BYTES) + b"\n") + b"0\r\n\r\n")
        stop.wait(5)

    with upstream(sse_then(rest)) as server:
        allow(settings, server)
        _took, answer = closes_and_next(server.url)
        assert answer == numbered(2)
        assert server.connections == 2


# --- The MCP gateway's request rate, taken with the token's read ---------------------------

BURST = 3
MCP = "http://testserver/mcp/"


@pytest.fixture
def slow_rate(settings: Any) -> Iterator[None]:
    """Three requests at once, then one every 10 s."""
    settings.HARNESS_AGENT_REQUESTS_PER_SECOND = 0.1
    settings.HARNESS_AGENT_REQUEST_BURST = BURST
    settings.HARNESS_MAX_SESSIONS_PER_MINUTE = 0
    limits._refused_until.clear()
    yield
    limits._refused_until.clear()


def gateway(headers: dict[str, str], method: str = "GET") -> tuple[int, dict[str, str], Any]:
    """One request to the MCP gateway's ASGI app, in this process: its status, headers and
    JSON body. (A GET is authenticated and counted, then answered 405: nothing of an MCP
    exchange runs.)"""
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "scheme": "http",
        "path": "/mcp/",
        "query_string": b"",
        "headers": [(b"host", b"testserver")]
        + [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    asyncio.run(application(scope, receive, send))
    start = sent[0]
    answer_headers = {k.decode(): v.decode() for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], answer_headers, json.loads(body)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def access_token(fx: AgentFixture, *, audience: str = MCP, expired: bool = False) -> str:
    """An OAuth access token issued to the agent (as the token endpoint stores one)."""
    value = f"hro_{fx.agent.pk}_{time.monotonic_ns()}"
    lifetime = timedelta(hours=-1 if expired else 1)
    stored = AccessToken.objects.create(
        user=fx.owner, token=value, expires=timezone.now() + lifetime, resource=[audience]
    )
    AgentToken.objects.create(access_token=stored, agent=fx.agent)
    return value


def assert_counted(headers: dict[str, str], times: int = BURST) -> None:
    """`times` requests go through (405 for a GET), then the next is refused 429 as before:
    the gateway's error body, Retry-After, and the same from this process's memory."""
    assert [gateway(headers)[0] for _ in range(times)] == [405] * times
    for _ in range(2):
        status, answer_headers, body = gateway(headers)
        assert status == 429, body
        assert body["error"]["code"] == "too_many_requests"
        assert "HARNESS_AGENT_REQUESTS_PER_SECOND" in body["error"]["message"]
        assert 1 <= int(answer_headers["retry-after"]) <= 30


@pytest.mark.django_db(transaction=True)
def test_every_authenticated_mcp_request_is_counted_before_anything_and_429_is_unchanged(
    slow_rate: None,
) -> None:
    fx = make_agent()
    assert_counted(bearer(fx.token))
    # A POST (an MCP message) is refused before its body is read, as a GET is.
    status, _, body = gateway(bearer(fx.token), method="POST")
    assert status == 429, body


@pytest.mark.django_db(transaction=True)
def test_an_oauth_token_of_the_agent_takes_from_the_same_bucket(slow_rate: None) -> None:
    """An agent signed in with OAuth besides its bearer token has one share, not two,
    whichever it spends first."""
    fx = make_agent()
    oauth = access_token(fx)
    assert [gateway(bearer(fx.token))[0] for _ in range(BURST)] == [405] * BURST
    assert gateway(bearer(oauth))[0] == 429
    other = make_agent()
    assert_counted(bearer(access_token(other)))
    assert gateway(bearer(other.token))[0] == 429


@pytest.mark.django_db(transaction=True)
def test_another_agents_session_id_counts_for_the_tokens_agent_only(slow_rate: None) -> None:
    """A token sent with the Mcp-Session-Id of another agent's session is counted for the
    token's agent (the session is not its own, so it is not read): the other agent keeps
    its whole share, and the sender does not get a second one."""
    mine, theirs = make_agent(), make_agent()
    their_session = agents.join_run(agent=theirs.agent, client=mcp.CLIENT, title="t", idle=0)[0]
    my_session = agents.join_run(agent=mine.agent, client=mcp.CLIENT, title="m", idle=0)[0]
    assert authenticate_and_count(mine.token, their_session.external_id, MCP)[:2] == (
        mine.agent,
        None,
    )
    agent, session, refusal = authenticate_and_count(mine.token, my_session.external_id, MCP)
    assert (agent, session, refusal) == (mine.agent, my_session, None)
    with_theirs = {**bearer(mine.token), "Mcp-Session-Id": their_session.external_id}
    assert_counted(with_theirs, times=BURST - 2)
    assert [gateway(bearer(theirs.token))[0] for _ in range(BURST)] == [405] * BURST


@pytest.mark.django_db(transaction=True)
def test_an_unauthenticated_mcp_request_takes_nothing_and_gets_the_same_401(
    slow_rate: None,
) -> None:
    """No token, another scheme, a forged token with the agent's prefix, an expired OAuth
    token or one for another resource: each is 401 with its challenge, never 429, and the
    agent's share is whole afterwards."""
    fx = make_agent()
    forged = f"hrn_{fx.agent.token_prefix}_{'x' * 40}"
    # (each with the token it carries, and whether the challenge says one was sent)
    refused = [
        ({}, "", False),
        ({"Authorization": f"Basic {fx.token}"}, fx.token, True),
        (bearer(forged), forged, True),
        (bearer(expired := access_token(fx, expired=True)), expired, True),
        (bearer(other := access_token(fx, audience="https://elsewhere.example/mcp/")), other, True),
    ]
    for headers, token, sent in refused:
        for _ in range(BURST + 1):
            status, answer_headers, body = gateway(headers)
            assert status == 401, (headers, body)
            assert body["error"]["code"] == "invalid_token"
            challenge = answer_headers["www-authenticate"]
            assert challenge.startswith('Bearer realm="harness", resource_metadata=')
            assert ('error="invalid_token"' in challenge) == sent
        if token != fx.token:
            assert authenticate_and_count(token, "", MCP) == (None, None, None)
    assert_counted(bearer(fx.token))
