"""A bound on how long a client may take to send one request to daphne (line, headers
and body): HARNESS_REQUEST_RECEIVE_TIMEOUT seconds.

daphne reads a whole request with Twisted before the ASGI application sees any of it, and
Twisted's only clock is an idle timeout (12 hours by default) that every byte restarts: a
client sending a byte every few seconds was held forever, and an ASGI middleware never
learns of it. So the bound is kept where the bytes arrive: daphne's HTTP/1.1 channel
starts a clock when a connection opens and when it is ready for the next request on a
kept-alive connection, and stops it when the request is complete. When it rings, a
client that sent part of a request is answered 408 and the connection is closed (a
kept-alive connection that sent nothing is closed quietly), and it is aborted if the
client does not read the answer either. WebSocket connections are bounded only until
their upgrade request is complete. `install` is called by harness_site.asgi, which every
daphne of Harness loads before it listens.

Connections are also counted per peer address (an IPv6 address by its /64, which one
host commonly holds whole): past HARNESS_MAX_CONNECTIONS_PER_ADDRESS open at once, a new
one is closed as it opens. Every open connection holds a file descriptor until its clock
rings, and one peer that opened as many as the process may hold (1,024 under a common
service limit) and dripped a byte into each had every other agent's connection closed
unanswered, for as long as it kept opening them.

A response that fails once started is cut: daphne answered an application that raised with
a 500 page, which it could not start over a response already started, and left that
response open and unfinished; now its connection is aborted, so the client sees a cut
download, not one that never ends.

A response is sent no faster than its client reads it. daphne handed every body message
of a streamed response to Twisted at once, and Twisted keeps what the client has not read
in memory without bound: an audit export (gigabytes of the log) to a client that read
nothing was held whole in the web process. Now the application's `send` of a body part
waits while the connection's send buffer is full (Twisted's pauseProducing), so the
export's database cursor waits with it; a client that takes nothing for
HARNESS_RESPONSE_STALL_TIMEOUT seconds has its connection aborted, which ends the response
and gives its database connection back.

And a POST's body is not parsed by Twisted into form arguments (`Request.args`), which
nothing of daphne or Harness reads: Twisted parsed every POST's Content-Type with the
`email` package first (about 150 us a request, 1-2% of an allowed `/mcp/` call's CPU:
docs/benchmarks.md), and a form body a second time beside Django's own parse; a multipart
body it could not read was answered with its own bare 400, never reaching the application.
"""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any

from daphne import http_protocol, server, ws_protocol
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from twisted.web import http

_BODY_408 = b"The request did not arrive in time (HARNESS_REQUEST_RECEIVE_TIMEOUT).\n"
RESPONSE_408 = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_BODY_408), _BODY_408)
)


_BODY_413 = b"The request's body is far larger than Harness takes (HARNESS_MAX_BODY_BYTES).\n"
RESPONSE_413 = (
    b"HTTP/1.1 413 Content Too Large\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_BODY_413), _BODY_413)
)


def body_bound(max_body_bytes: int) -> int:
    """The most body bytes daphne takes in for one request: twice what the application
    reads (HARNESS_MAX_BODY_BYTES) and 64 KiB for chunked framing, so that a body just
    over that is the application's to refuse (its own message), and a larger one is
    refused as it arrives. Twisted kept the whole of any body (in a temporary file past
    100 KB) before the application saw any of it: anyone, signed in or not, could fill
    the disk at the receive timeout's pace on each of their connections."""
    return 2 * max_body_bytes + 65536 if max_body_bytes > 0 else 0


class BoundedHTTPChannel(http.HTTPChannel):
    """Twisted's HTTP/1.1 channel with a clock on receiving each request and a bound on
    its body (`max_body`: a larger Content-Length, or more bytes of a chunked body, is
    answered 413 and the connection closed), whose requests leave their bodies to the
    application (`requestFactory`: no form parsing)."""

    receive_timeout: float = 30.0
    max_body: int = 0  # (0: no bound but the application's own)
    # Seconds a response may wait for its client to take any of it (0: no bound).
    stall_timeout: float = 120.0
    _body_bytes = 0  # of the request being received, framing included
    _refused = False  # answered 413: nothing more is read
    _receive_clock: Any = None
    _receiving = False  # a byte of the next request has arrived
    _request_factory: Any = http.Request

    @property
    def requestFactory(self) -> Any:
        return self._request_factory

    @requestFactory.setter
    def requestFactory(self, factory: Any) -> None:
        # (daphne's factory sets its WebRequest on each protocol it builds)
        self._request_factory = _formless(factory)

    def __init__(self) -> None:
        super().__init__()
        self._senders: list[asyncio.Future[None]] = []  # (the application's sends waiting)

    def connectionMade(self) -> None:
        super().connectionMade()
        self._start_clock()

    def dataReceived(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._handlingRequest and data:
            self._receiving = True
        super().dataReceived(data)

    def allHeadersReceived(self) -> None:
        self._body_bytes = 0
        if self.max_body and self.length is not None and self.length > self.max_body:
            self._too_large()
            return
        super().allHeadersReceived()

    def rawDataReceived(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._handlingRequest:  # (a body's bytes: counted as they arrive)
            self._body_bytes += len(data)
            if self.max_body and self._body_bytes > self.max_body:
                self._too_large()
                return
        super().rawDataReceived(data)

    def _too_large(self) -> None:
        self._refused = True
        self._stop_clock()
        if self.transport is not None:
            self.transport.write(RESPONSE_413)  # type: ignore[call-arg, misc]  # (a zope interface)
        self.loseConnection()

    def allContentReceived(self) -> None:
        self._stop_clock()
        self._receiving = False
        super().allContentReceived()

    def requestDone(self, request: Any) -> None:
        # Started first: buffered bytes of a pipelined next request are read inside
        # requestDone, and may complete that request (which stops the clock again).
        if self.persistent:
            self._start_clock()
        super().requestDone(request)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._stop_clock()
        super().connectionLost(reason)
        self._wake_senders()

    def resumeProducing(self) -> None:
        super().resumeProducing()
        self._wake_senders()

    async def drained(self) -> None:
        """Until the client has taken enough of the response for more to be written (the
        transport resumed this channel), or the connection is gone. A client that takes
        nothing for `stall_timeout` seconds has its connection aborted."""
        if not self._waitingForTransport or self.transport is None:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._senders.append(waiter)
        try:
            await asyncio.wait_for(waiter, self.stall_timeout or None)
        except TimeoutError:
            if self.transport is not None:
                self.transport.abortConnection()

    def _wake_senders(self) -> None:
        senders, self._senders = self._senders, []
        for waiter in senders:
            if not waiter.done():
                waiter.set_result(None)

    def _start_clock(self) -> None:
        self._stop_clock()
        if self.receive_timeout > 0:
            self._receive_clock = self.callLater(self.receive_timeout, self._too_slow)

    def _stop_clock(self) -> None:
        if self._receive_clock is not None and self._receive_clock.active():
            self._receive_clock.cancel()
        self._receive_clock = None

    def _too_slow(self) -> None:
        self._receive_clock = None
        if self._handlingRequest or self.transport is None or self.transport.disconnecting:
            return
        if self._receiving:
            self.transport.write(RESPONSE_408)  # type: ignore[call-arg, misc]  # (a zope interface)
        # Twisted's own idle timeout path: close, and abort if the client does not read.
        self.timeoutConnection()


_FORMLESS: dict[type, type] = {}


def _formless(factory: Any) -> Any:
    """`factory`'s request class, building requests that Twisted does not parse into form
    arguments (its `parsePOSTFormSubmission` off); anything but a class is kept as it is."""
    if not isinstance(factory, type):
        return factory
    formless = _FORMLESS.get(factory)
    if formless is None:
        base: Any = factory  # (its __init__, called as the class's own)

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            base.__init__(self, *args, **kwargs)
            self._parsePOSTFormSubmission = False

        formless = _FORMLESS.setdefault(
            factory, type(f"Formless{factory.__name__}", (factory,), {"__init__": __init__})
        )
    return formless


class CountedProtocol(http._GenericHTTPChannelProtocol):
    """Twisted's generic HTTP protocol (which may switch to HTTP/2 when TLS negotiates it),
    counted per peer address for as long as its connection is open. Only the reactor's
    thread runs it: the counts need no lock."""

    max_per_address = 0  # 0: not counted
    open_by_address: dict[str, int] = {}  # noqa: RUF012  (shared by every connection)

    def makeConnection(self, transport: Any) -> None:
        # (the wrapper hands makeConnection to its channel, whose connectionMade runs;
        # its own connectionMade is never called)
        super().makeConnection(transport)
        address = _address_of(transport.getPeer()) if self.max_per_address else None
        if address is None:
            return
        if self.open_by_address.get(address, 0) >= self.max_per_address:
            transport.abortConnection()  # its descriptor is given back at once
            return
        self.open_by_address[address] = self.open_by_address.get(address, 0) + 1
        _counted[transport] = address
        self._counted_transport = transport

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        _release(getattr(self, "_counted_transport", None))
        super().connectionLost(reason)


class CountedWebSocketProtocol(ws_protocol.WebSocketProtocol):  # type: ignore[misc]
    """daphne's WebSocket protocol, which a WebSocket upgrade hands the connection to:
    the HTTP protocol that counted it hears nothing more, so the close is given back
    here (each WebSocket ever opened stayed counted, and an address that opened the
    bound's number, a browser reconnecting its approval queue, was refused every
    connection until daphne restarted)."""

    def makeConnection(self, transport: Any) -> None:
        self._counted_transport = transport
        super().makeConnection(transport)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        _release(getattr(self, "_counted_transport", None))
        super().connectionLost(reason)


# The connections counted, by their transport (which outlives a change of protocol).
_counted: dict[Any, str] = {}


def _release(transport: Any) -> None:
    """Give back the count of `transport`'s connection, once, whichever protocol it ended
    under; nothing for one never counted."""
    address = _counted.pop(transport, None) if transport is not None else None
    if address is None:
        return
    left = CountedProtocol.open_by_address.get(address, 1) - 1
    if left > 0:
        CountedProtocol.open_by_address[address] = left
    else:
        CountedProtocol.open_by_address.pop(address, None)


def _address_of(peer: Any) -> str | None:
    """The key a peer's connections are counted under: its IPv4 address, its IPv6 /64;
    None for a peer with no IP address (a UNIX socket)."""
    host = getattr(peer, "host", None)
    if not isinstance(host, str):
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    if ip.version == 6 and ip.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip.ipv4_mapped or ip) if ip.version == 6 else str(ip)


def _bounded_protocol(factory: Any) -> Any:
    """What daphne's factory builds for each connection: the counted generic protocol
    around a bounded HTTP/1.1 channel."""
    return CountedProtocol(BoundedHTTPChannel())


_daphne_reply = server.Server.handle_reply


async def _paced_reply(self: Any, protocol: Any, message: dict[str, Any]) -> None:
    """daphne's `send` to the application, returning once the client has room for more
    when the message is a part of a body with more to come."""
    await _daphne_reply(self, protocol, message)
    channel = getattr(protocol, "channel", None)
    if message.get("more_body") and isinstance(channel, BoundedHTTPChannel):
        await channel.drained()


_daphne_exception = http_protocol.WebRequest.handle_exception


def _ended_on_error(self: Any, exception: BaseException) -> None:
    """daphne's answer to an application that raised: its 500 page, or, when the response
    had started (a streamed response that failed mid-way: an export whose database
    connection died), the connection aborted. daphne tried to start a 500 over it, which
    raised, and left the response open unfinished: the client waited, for ever, on a
    download that would never end and did not read as cut."""
    if not self._response_started:
        _daphne_exception(self, exception)
    elif self.channel is not None and self.channel.transport is not None:
        self.channel.transport.abortConnection()


def install(
    receive_timeout: float, max_per_address: int = 0, max_body: int = 0, stall: float = 120.0
) -> None:
    """Bound every request daphne receives from now on (0: no bound but Twisted's own), its
    body's bytes (`body_bound`; 0: no bound), the connections open at once per peer
    address (0: not counted), and how long a response waits for its client to read
    (`stall` seconds; 0: no bound)."""
    BoundedHTTPChannel.receive_timeout = receive_timeout
    BoundedHTTPChannel.max_body = max_body
    BoundedHTTPChannel.stall_timeout = stall
    CountedProtocol.max_per_address = max_per_address
    http_protocol.HTTPFactory.protocol = _bounded_protocol
    ws_protocol.WebSocketFactory.protocol = CountedWebSocketProtocol
    server.Server.handle_reply = _paced_reply
    http_protocol.WebRequest.handle_exception = _ended_on_error
