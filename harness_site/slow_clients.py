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
"""

from __future__ import annotations

from typing import Any

from daphne import http_protocol
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


class BoundedHTTPChannel(http.HTTPChannel):
    """Twisted's HTTP/1.1 channel with a clock on receiving each request."""

    receive_timeout: float = 30.0
    _receive_clock: Any = None
    _receiving = False  # a byte of the next request has arrived

    def connectionMade(self) -> None:
        super().connectionMade()
        self._start_clock()

    def dataReceived(self, data: bytes) -> None:
        if not self._handlingRequest and data:
            self._receiving = True
        super().dataReceived(data)

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


def _bounded_protocol(factory: Any) -> Any:
    """What daphne's factory builds for each connection (Twisted's generic HTTP protocol,
    which may switch to HTTP/2 when TLS negotiates it), around a bounded HTTP/1.1 channel."""
    return http._GenericHTTPChannelProtocol(BoundedHTTPChannel())


def install(receive_timeout: float) -> None:
    """Bound every request daphne receives from now on (0: no bound but Twisted's own)."""
    BoundedHTTPChannel.receive_timeout = receive_timeout
    http_protocol.HTTPFactory.protocol = _bounded_protocol
