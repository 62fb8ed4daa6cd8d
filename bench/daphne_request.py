"""A measurement of Twisted's own handling of one request in daphne's HTTP/1.1 channel
(docs/benchmarks.md, "Twisted's form parsing off"): an MCP `tools/call` POST, as S14's
client sends it, fed to `harness_site.slow_clients.BoundedHTTPChannel` on an in-memory
transport over and over, the request answered 200 with no body by a bare request class,
and the process's CPU per request read with `time.process_time`. A: Twisted's request as
it comes (it parses a POST's Content-Type with `email` and a form body into
`Request.args`); B: the same class as Harness's channel builds it
(`slow_clients._formless`: no form parsing). Rounds of each alternate; the ratio B/A is
per pair of rounds (median, min, max).

    python -m bench.daphne_request [--requests N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import time

from twisted.internet.testing import StringTransport
from twisted.web import http

BODY = (
    b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"up__echo",'
    b'"arguments":{"text":"tH0 c3 17"}}}'
)
REQUEST = (
    b"POST /mcp/ HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
    b"Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
    b"Mcp-Session-Id: 3b5e0c1f6a2d4e8f9a0b1c2d3e4f5a6b\r\nMcp-Protocol-Version: 2025-11-25\r\n"
    b"Authorization: Bearer hk_0123456789abcdef\r\nContent-Length: %d\r\n\r\n%s"
) % (len(BODY), BODY)


class Answered(http.Request):
    """A request answered at once: 200, no body (nothing of daphne's application)."""

    def process(self) -> None:
        self.setResponseCode(200)
        self.finish()  # type: ignore[no-untyped-call]


def per_request(formless: bool, requests: int) -> float:
    """Microseconds of this process's CPU per request on one kept-alive connection, its
    requests built as Harness's channel builds them (`formless`) or as Twisted does."""
    from harness_site.slow_clients import BoundedHTTPChannel

    channel = BoundedHTTPChannel()  # type: ignore[no-untyped-call]
    channel.receive_timeout = 0  # (no clock: nothing to wait for here)
    channel.requestFactory = Answered  # (as daphne sets its own: made formless)
    if not formless:
        channel._request_factory = Answered  # (A: the class itself, as Twisted builds it)
    transport = StringTransport()  # type: ignore[no-untyped-call]
    channel.makeConnection(transport)  # type: ignore[no-untyped-call]
    started = time.process_time()
    for _ in range(requests):
        channel.dataReceived(REQUEST)
        transport.clear()  # type: ignore[no-untyped-call]
    return (time.process_time() - started) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=10)
    options = parser.parse_args()
    import django

    django.setup()
    a: list[float] = []
    b: list[float] = []
    for r in range(options.rounds):
        for side in ("a", "b") if r % 2 == 0 else ("b", "a"):
            if side == "a":
                a.append(per_request(False, options.requests))
            else:
                b.append(per_request(True, options.requests))
    ratios = [y / x for x, y in zip(a, b, strict=True)]
    print(f"A (Twisted's request, form parsing on): {statistics.median(a):.1f} us per request")
    print(f"B (as Harness's channel builds it): {statistics.median(b):.1f} us per request")
    print(
        f"B/A: median {statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}] "
        f"over {options.rounds} pairs; A - B {statistics.median(a) - statistics.median(b):.1f} us"
    )


if __name__ == "__main__":
    import os

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "harness_site.settings")
    os.environ.setdefault("HARNESS_SECRET_KEY", "bench-daphne-request-not-secret")
    main()
