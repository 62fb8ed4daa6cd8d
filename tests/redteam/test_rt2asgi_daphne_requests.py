"""rt2asgi: what a client may send a real daphne after rtfresh (ServedAtTheRoot) and
perf37 (Twisted no longer parses POST bodies). Regression guards, none of them a finding:

- every way a client may name a root path (daphne's header in any case, with
  underscores, twice; the prefixes proxies send, which Django never reads) leaves the
  page's addresses at the root;
- a request framed two ways (Content-Length and Transfer-Encoding) or with a chunk size
  that is no number is refused by Twisted before the application, as before perf37, and
  the connection is closed (nothing smuggled after it is answered);
- a multipart body Django cannot read is Django's 400, not a 5xx."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.live import daphne, free_port, live_env

pytestmark = pytest.mark.heavy

EVIL = b"/evil-root"


@pytest.fixture(scope="module")
def daphne_port(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    tmp: Path = tmp_path_factory.mktemp("rt2asgi")
    port = free_port()
    with daphne(live_env(tmp), port, tmp / "daphne.log"):
        yield port


def exchange(port: int, raw: bytes) -> bytes:
    """Send `raw` on one connection; everything daphne answers until it closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(raw)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    return got


def get_login(port: int, extra: bytes) -> bytes:
    raw = (
        b"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + extra
        + b"Connection: close\r\n\r\n"
    )
    return exchange(port, raw)


@pytest.mark.parametrize(
    "headers",
    [
        b"Daphne-Root-Path: /evil-root\r\n",
        b"DAPHNE-ROOT-PATH: /evil-root\r\n",
        b"daphne-root-path: /evil-root\r\ndaphne-root-path: /evil-root\r\n",
        b"Daphne_Root_Path: /evil-root\r\n",
        b"X-Forwarded-Prefix: /evil-root\r\n",
        b"X-Script-Name: /evil-root\r\n",
        b"Script-Name: /evil-root\r\nScript_Name: /evil-root\r\n",
    ],
)
def test_no_header_moves_the_pages_root(daphne_port: int, headers: bytes) -> None:
    answer = get_login(daphne_port, headers)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    assert re.search(rb'(href|action)="/accounts/', answer), answer[:300]
    assert EVIL not in answer


SMUGGLED = b"GET /smuggled-by-rt2asgi/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" % 5,
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
        b"Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        b"Content-Length: 5\r\nContent-Length: 40\r\n\r\nhello",
        b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    ],
)
def test_a_body_framed_two_ways_is_refused_before_the_application(
    daphne_port: int, framing: bytes
) -> None:
    raw = (
        b"POST /api/v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: multipart/form-data; boundary=zz\r\n" + framing + SMUGGLED
    )
    answer = exchange(daphne_port, raw)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
    assert answer.count(b"HTTP/1.1 ") == 1, answer  # the smuggled request is never read


def test_a_multipart_body_django_cannot_read_is_a_400(daphne_port: int) -> None:
    body = b"--zz\r\nContent-Disposition: form-data; name=\r\n\r\nx\r\n--zz--\r\n" * 3
    raw = (
        b"POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: multipart/form-data; boundary=\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    )
    answer = exchange(daphne_port, raw)
    assert answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 403")), answer[:300]
