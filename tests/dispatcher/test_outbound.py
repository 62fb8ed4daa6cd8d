"""The outbound door (floor.outbound): a loopback listener that must never be reached
(directly, through a redirect from an allowed host, through a name that resolves to
loopback, on a port not allowed), the size cap and the timeout, against real sockets."""

from __future__ import annotations

import contextlib
import gzip
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import pytest

from floor import outbound
from floor.outbound import OutboundRefused

# No database, no Redis: the same on both backends (tests/conftest.py).
pytestmark = pytest.mark.backend_independent

MIB = 1024 * 1024


@dataclass
class Listener:
    port: int
    hits: list[str] = field(default_factory=list)
    sent: list[int] = field(default_factory=lambda: [0])
    # Set when a "big" answer stops being written: all sent, or the client hung up.
    body_ended: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def listener(answer: str = "ok", location: str = "", size: int = 0) -> Iterator[Listener]:
    """An HTTP server on 127.0.0.1 that records every request it gets. `answer`: "ok",
    "redirect" (to `location`), "big" (`size` bytes, no Content-Length), "dribble" (a
    byte every 0.2 s, forever), "dribble-headers" (the same inside a header), "silent"
    (never answers)."""
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:  # noqa: N802  (http.server's name)
            state.hits.append(self.path)
            if answer == "silent":
                stop.wait(30)
                return
            if answer == "dribble-headers":  # a status line, then one header a byte at a time
                with contextlib.suppress(OSError):
                    self.wfile.write(b"HTTP/1.0 200 OK\r\nX-Slow: ")
                    while not stop.is_set():
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        stop.wait(0.2)
                return
            if answer == "redirect":
                self.send_response(302)
                self.send_header("Location", location)
                self.end_headers()
                return
            self.send_response(200)
            self.end_headers()
            with contextlib.suppress(OSError):  # the client hung up: the cap, the timeout
                self._body()

        def _body(self) -> None:
            if answer == "big":
                chunk = b"x" * 65536
                try:
                    while state.sent[0] < size:
                        self.wfile.write(chunk)
                        state.sent[0] += len(chunk)
                finally:
                    state.body_ended.set()
            elif answer == "dribble":
                while not stop.is_set():
                    self.wfile.write(b".")
                    self.wfile.flush()
                    stop.wait(0.2)
            else:
                self.wfile.write(b"fine")

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state = Listener(server.server_port)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


def test_a_loopback_listener_is_never_reached_directly(settings: Any) -> None:
    settings.HARNESS_OUTBOUND_ALLOW = []
    with listener() as target:
        for url in (target.url, f"http://[::ffff:127.0.0.1]:{target.port}/"):
            with pytest.raises(OutboundRefused, match="refused: a loopback address"):
                outbound.send("GET", url)
        with pytest.raises(OutboundRefused, match="refused: an unspecified address"):
            outbound.send("GET", f"http://0.0.0.0:{target.port}/")  # Linux: loopback
    assert target.hits == []


def test_a_name_that_resolves_to_loopback_is_refused_where_it_connects(settings: Any) -> None:
    """Nothing is checked before the connection but the URL's form: the address refused
    is the one the name resolved to as the socket was made (no second lookup to rebind)."""
    settings.HARNESS_OUTBOUND_ALLOW = []
    with listener() as target:
        with pytest.raises(OutboundRefused, match="refused: a loopback address"):
            outbound.send("GET", f"http://localhost:{target.port}/")
        with pytest.raises(OutboundRefused, match="refused: a loopback address"):
            outbound.requests_session().get(f"http://localhost:{target.port}/")
    assert target.hits == []


def test_a_redirect_from_an_allowed_host_is_not_followed(settings: Any) -> None:
    with listener() as target, listener("redirect", location="") as allowed:
        settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{allowed.port}"]
        for location in (target.url + "/inner", f"http://localhost:{target.port}/inner"):
            with listener("redirect", location=location) as hop:
                settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{hop.port}"]
                answer = outbound.send("POST", hop.url + "/hook", content=b"{}")
                assert answer.status == 302  # an answer like any other, not followed
                session_answer = outbound.requests_session().post(hop.url + "/hook", data=b"{}")
                assert session_answer.status_code == 302
                assert hop.hits == ["/hook", "/hook"]
    assert target.hits == []


def test_an_allowed_host_port_allows_that_port_only(settings: Any) -> None:
    with listener() as allowed, listener() as other:
        settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{allowed.port}"]
        assert outbound.send("GET", allowed.url + "/a").body == b"fine"
        with pytest.raises(OutboundRefused, match="loopback"):
            outbound.send("GET", other.url + "/b")
        settings.HARNESS_OUTBOUND_ALLOW = [f"localhost:{allowed.port}"]
        assert outbound.send("GET", f"http://localhost:{allowed.port}/c").status == 200
        with pytest.raises(OutboundRefused, match="loopback"):
            outbound.send("GET", f"http://localhost:{other.port}/d")
    assert allowed.hits == ["/a", "/c"] and other.hits == []


def test_an_answer_larger_than_the_cap_is_cut_not_read_whole(settings: Any) -> None:
    with listener("big", size=30 * MIB) as big:
        settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{big.port}"]
        settings.HARNESS_OUTBOUND_MAX_BYTES = MIB
        with pytest.raises(OutboundRefused, match=f"answer larger than {MIB} bytes"):
            outbound.send("GET", big.url)
        # The server could not write its 30 MiB: the client stopped reading and hung up.
        assert big.body_ended.wait(10)
    assert big.sent[0] < 30 * MIB


@pytest.mark.parametrize("answer", ["dribble", "silent", "dribble-headers"])
@pytest.mark.timeout(30)
def test_a_slow_endpoint_is_cut_at_the_timeout(settings: Any, answer: str) -> None:
    with listener(answer) as slow:
        settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{slow.port}"]
        settings.HARNESS_OUTBOUND_TIMEOUT = 1.0
        started = time.monotonic()
        with pytest.raises(OutboundRefused, match="^timed out$"):
            outbound.send("GET", slow.url)
        assert time.monotonic() - started < 5  # the timeout's second, not the endpoint's hour
        assert slow.hits == ["/"]


def test_the_async_client_of_mcp_servers_keeps_the_same_policy(settings: Any) -> None:
    settings.HARNESS_OUTBOUND_ALLOW = []

    async def fetch(url: str) -> int:
        async with outbound.async_client(timeout=5) as client:
            return (await client.get(url)).status_code

    with listener() as target, listener("redirect", location=target.url) as hop:
        with pytest.raises(OutboundRefused, match="loopback"):
            anyio.run(fetch, f"http://localhost:{target.port}/")
        settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{hop.port}"]
        assert anyio.run(fetch, hop.url) == 302
    assert target.hits == []


@pytest.mark.parametrize(
    "address",
    [
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "169.254.169.254",
        "224.0.0.1",
        "240.0.0.1",
        "0.0.0.0",  # noqa: S104  (an address refused, not bound)
        "::1",
        "fe80::1",
        "fc00::1",
        "fd00:ec2::254",
        "ff02::1",
        "::ffff:10.0.0.1",
    ],
)
def test_every_inward_address_is_refused(address: str) -> None:
    assert outbound.refusal("x", address, 80, outbound.Allowance()).startswith("refused: ")
    assert outbound.kind_of(ipaddress.ip_address("169.254.169.254")) == "a cloud metadata address"


def test_public_addresses_pass_and_networks_can_be_allowed() -> None:
    assert outbound.refusal("x", "93.184.216.34", 443, outbound.Allowance()) == ""
    assert outbound.refusal("x", "2606:4700::1111", 443, outbound.Allowance()) == ""
    allowed = outbound.parse_allow(["10.1.0.0/16", "[::1]:8025", "Hooks.Internal."])
    assert outbound.refusal("x", "10.1.2.3", 80, allowed) == ""
    assert outbound.refusal("x", "10.2.0.1", 80, allowed) != ""
    assert outbound.refusal("x", "::1", 8025, allowed) == ""
    assert outbound.refusal("x", "::1", 8026, allowed) != ""
    assert outbound.refusal("hooks.internal", "10.9.9.9", 1234, allowed) == ""


@pytest.mark.parametrize("entry", ["http://x", "host:0", "host:99999", "a b", "[::1]"])
def test_an_unreadable_allow_entry_is_named(entry: str) -> None:
    with pytest.raises(ValueError, match="'"):
        outbound.parse_allow([entry])


def test_web_push_goes_only_to_known_push_services(settings: Any) -> None:
    settings.HARNESS_OUTBOUND_ALLOW = []
    for url in (
        "https://fcm.googleapis.com/fcm/send/abc",
        "https://updates.push.services.mozilla.com/wpush/v2/abc",
        "https://web.push.apple.com/QGx",
        "https://wns2-by3p.notify.windows.com/w/?token=abc",
    ):
        assert outbound.check_url(url, push=True)
    for url in (
        "https://evil.example/push",
        "http://fcm.googleapis.com/fcm/send/abc",
        "https://push.apple.com.evil.example/",
    ):
        with pytest.raises(OutboundRefused, match="not a known push service"):
            outbound.check_url(url, push=True)
    settings.HARNESS_OUTBOUND_ALLOW = ["push.internal:8443"]
    assert outbound.check_url("https://push.internal:8443/p", push=True)


def test_the_failure_reason_has_a_fixed_size(settings: Any) -> None:
    """Whatever the URL or the remote end: a handful of fixed texts, with an address."""
    settings.HARNESS_OUTBOUND_ALLOW = []
    reasons = set()
    for url in ("ftp://x/", "http://localhost:1/" + "a" * 5000, "http://[::1]:1/"):
        with pytest.raises(OutboundRefused) as refused:
            outbound.send("GET", url)
        reasons.add(str(refused.value))
    assert all(len(reason) < 80 for reason in reasons), reasons


def test_socket_check_runs_on_every_address_a_name_has() -> None:
    """A name resolving to a public and an inward address is refused as a whole."""
    infos = [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", 80)),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 80)),
    ]
    with pytest.raises(OutboundRefused, match="loopback"):
        outbound._checked("mixed.example", 80, infos)


@pytest.mark.parametrize("url", ["http://0177.0.0.1/", "http://1.2.3.04/"])
def test_a_url_only_httpx_refuses_is_a_refusal_not_a_crash(settings: Any, url: str) -> None:
    settings.HARNESS_OUTBOUND_ALLOW = []
    with pytest.raises(OutboundRefused, match="^refused: not a valid URL$"):
        outbound.send("GET", url)


def test_the_async_client_cuts_an_answer_past_its_cap_as_it_arrives(settings: Any) -> None:
    # The HTTP upstream MCP path reads answers through this client: a server's 30 MiB
    # answer must not be held whole in the worker.
    async def fetch(url: str) -> int:
        async with outbound.async_client(limit=MIB, timeout=10) as client:
            return len((await client.get(url)).content)

    with listener("big", size=30 * MIB) as big:
        settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{big.port}"]
        with pytest.raises(OutboundRefused, match=f"^answer larger than {MIB} bytes$"):
            anyio.run(fetch, big.url)
        assert big.body_ended.wait(10)  # the client hung up: the server's write failed
    assert big.sent[0] < 30 * MIB


def test_the_async_client_refuses_a_compressed_answer(settings: Any) -> None:
    # 1 KiB of gzip decodes to 1 MiB and more: a cap on the bytes read would not hold.
    bomb = gzip.compress(b"\0" * (8 * MIB))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(bomb)))
            self.end_headers()
            self.wfile.write(bomb)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{server.server_port}"]

    async def fetch() -> int:
        async with outbound.async_client(limit=MIB, timeout=10) as client:
            return len((await client.get(f"http://127.0.0.1:{server.server_port}/")).content)

    try:
        with pytest.raises(OutboundRefused, match="^refused: a compressed answer$"):
            anyio.run(fetch)
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def sse_server(end: bool) -> Iterator[tuple[int, list[int]]]:
    """An HTTP/1.1 server answering each POST with one SSE event, its end (the last chunk)
    20 ms later when `end`, else never (until the client hangs up). Yields its port and
    the client port of each request (one port: one connection)."""
    ports: list[int] = []
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            ports.append(self.client_address[1])
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            event = b'event: message\ndata: {"jsonrpc": "2.0", "id": 1, "result": {}}\n\n'
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
            if end:
                time.sleep(0.02)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            else:
                stop.wait(10)
                self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield server.server_port, ports
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


async def read_first_events(url: str, times: int) -> list[float]:
    """`times` POSTs each read up to its first event and closed there, as the MCP SDK reads
    an SSE answer; how long each close took."""
    closes = []
    async with outbound.async_client(timeout=10) as client:
        for _ in range(times):
            async with client.stream("POST", url, json={"jsonrpc": "2.0", "id": 1}) as response:
                async for chunk in response.aiter_bytes():
                    assert b"result" in chunk
                    break
                started = time.monotonic()
                await response.aclose()
                closes.append(time.monotonic() - started)
    return closes


def test_an_sse_answer_closed_at_its_event_leaves_its_connection_for_the_next_request(
    settings: Any,
) -> None:
    # The MCP SDK stops reading an SSE answer at the message it waited for: the door reads
    # the answer's end, so the next call to the server goes on the same connection.
    with sse_server(end=True) as (port, ports):
        settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{port}"]
        anyio.run(read_first_events, f"http://127.0.0.1:{port}/mcp", 3)
    assert len(ports) == 3
    assert len(set(ports)) == 1


def test_an_sse_answer_that_does_not_end_is_closed_with_its_connection(settings: Any) -> None:
    with sse_server(end=False) as (port, ports):
        settings.HARNESS_OUTBOUND_ALLOW = [f"127.0.0.1:{port}"]
        closes = anyio.run(read_first_events, f"http://127.0.0.1:{port}/mcp", 2)
    assert len(set(ports)) == 2  # a new connection for the second request
    assert all(took < outbound.DRAIN_SECONDS + 2 for took in closes)
