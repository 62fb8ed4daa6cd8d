"""Slow clients are cut: a real daphne with HARNESS_REQUEST_RECEIVE_TIMEOUT short, and raw
sockets that send a request a byte at a time (harness_site.slow_clients)."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.live import daphne, free_port, live_env

pytestmark = pytest.mark.heavy

BOUND = 2.0  # seconds: the test daphne's HARNESS_REQUEST_RECEIVE_TIMEOUT
DRIP = 0.25  # seconds between two bytes of a slow client: well within Twisted's idle timeout


@pytest.fixture(scope="module")
def bounded_daphne(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[int]:
    """A daphne of this run's settings whose requests must arrive within BOUND seconds."""
    tmp: Path = tmp_path_factory.mktemp("slow")
    env = {**live_env(tmp), "HARNESS_REQUEST_RECEIVE_TIMEOUT": str(BOUND)}
    port = free_port()
    with daphne(env, port, tmp / "daphne.log"):
        yield port


def drip(port: int, data: bytes) -> tuple[bytes, float]:
    """Send `data` one byte every DRIP seconds until the server answers or closes; what it
    answered and after how many seconds."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(DRIP)
        answer = b""
        for byte in data:
            try:
                sock.sendall(bytes([byte]))
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:  # reset by the server after it answered
                break
            if not chunk:
                break
            answer += chunk
        sock.settimeout(10)
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except OSError:
            pass
    return answer, time.monotonic() - started


BODY = b'{"title": "' + b"x" * 200 + b'"}'
SLOW_BODY = (
    b"POST /api/v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Authorization: Bearer hk_nope\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)
SLOW_HEADERS = b"GET /api/v1/tools HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"y" * 200


def test_a_body_sent_a_byte_at_a_time_is_answered_408_within_the_bound(
    bounded_daphne: int,
) -> None:
    answer, took = drip(bounded_daphne, SLOW_BODY)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"HARNESS_REQUEST_RECEIVE_TIMEOUT" in answer
    # cut, not served after the whole drip (~60 s); 10 s of room for a loaded host (was 3)
    assert BOUND <= took < BOUND + 10


def test_headers_sent_a_byte_at_a_time_are_answered_408_within_the_bound(
    bounded_daphne: int,
) -> None:
    answer, took = drip(bounded_daphne, SLOW_HEADERS)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert BOUND <= took < BOUND + 10  # (the drip: about 60 s)


def test_a_silent_connection_is_closed_and_a_prompt_one_is_served_and_kept_alive(
    bounded_daphne: int,
) -> None:
    with socket.create_connection(("127.0.0.1", bounded_daphne)) as sock:
        sock.settimeout(60)
        started = time.monotonic()
        assert sock.recv(4096) == b""  # closed quietly: it asked nothing
        assert time.monotonic() - started < BOUND + 10  # (one kept open: recv times out)
    connection = http.client.HTTPConnection("127.0.0.1", bounded_daphne, timeout=10)
    try:
        for _ in range(2):  # two requests on one kept-alive connection, each answered
            connection.request("GET", "/api/v1/tools")
            response = connection.getresponse()
            assert response.status == 401 and b"invalid_token" in response.read()
        assert connection.sock is not None  # (still the same, open connection)
    finally:
        connection.close()


def test_a_post_body_reaches_the_application_unparsed_by_twisted(bounded_daphne: int) -> None:
    """A POST's body is the application's to read: a multipart body Twisted's form parser
    cannot read is answered by Harness (here: the token refused), not by Twisted's bare
    400 before the application sees it; a JSON body is answered the same; and a page's
    form POST with it gets Django's answer."""
    connection = http.client.HTTPConnection("127.0.0.1", bounded_daphne, timeout=10)
    try:
        for content_type, body in (
            ("multipart/form-data; boundary=zzz", b"not a form"),
            ("application/json", b'{"title": "t"}'),
        ):
            connection.request(
                "POST",
                "/api/v1/sessions",
                body=body,
                headers={"Authorization": "Bearer hk_nope", "Content-Type": content_type},
            )
            response = connection.getresponse()
            answer = response.read()
            assert response.status == 401 and b"invalid_token" in answer, (content_type, answer)
        # A page's form POST with that body: Django's answer (its CSRF refusal), no 5xx.
        connection.request(
            "POST",
            "/accounts/login/",
            body=b"not a form",
            headers={"Content-Type": "multipart/form-data; boundary=zzz"},
        )
        response = connection.getresponse()
        answer = response.read()
        assert response.status == 403 and b"CSRF" in answer, (response.status, answer[:300])
    finally:
        connection.close()


def test_a_body_far_over_the_bound_is_refused_as_it_arrives(bounded_daphne: int) -> None:
    """Twisted kept a whole body (in a temporary file past 100 KB) before the application
    could refuse it: anyone could fill the disk. A Content-Length over twice
    HARNESS_MAX_BODY_BYTES (and 64 KiB) is answered 413 at once; a chunked body is when
    its bytes pass that; a body just over HARNESS_MAX_BODY_BYTES is still the
    application's to refuse (its own message)."""
    from django.conf import settings

    from harness_site.slow_clients import body_bound

    bound = body_bound(settings.HARNESS_MAX_BODY_BYTES)
    head = (
        b"POST /api/v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer hk_nope\r\nContent-Type: application/json\r\n"
    )
    with socket.create_connection(("127.0.0.1", bounded_daphne), timeout=10) as sock:
        sock.sendall(head + b"Content-Length: %d\r\n\r\n" % (bound + 1) + b"x" * 1000)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    with socket.create_connection(("127.0.0.1", bounded_daphne), timeout=10) as sock:
        sock.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * 65536
        answer = b""
        try:
            for _ in range(bound // len(chunk) + 4):
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:  # (closed by the server once it answered)
            pass
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    connection = http.client.HTTPConnection("127.0.0.1", bounded_daphne, timeout=10)
    try:
        body = b'{"title": "' + b"x" * settings.HARNESS_MAX_BODY_BYTES + b'"}'
        connection.request(
            "POST",
            "/api/v1/sessions",
            body=body,
            headers={"Authorization": "Bearer hk_nope", "Content-Type": "application/json"},
        )
        response = connection.getresponse()
        response.read()
        assert response.status in (401, 413) and response.getheader("Content-Type", "").startswith(
            "application/json"
        ), response.status
    finally:
        connection.close()
