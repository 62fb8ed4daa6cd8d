"""Red team (rt8audit) of a streamed replay or export whose database fails mid-stream,
through a real daphne (PostgreSQL: the page's connection is ended by the server while the
page is read).

The page is streamed, holding the person's one export slot (HARNESS_MAX_EXPORTS_PER_PERSON=1)
and a connection of the process's pool (HARNESS_DB_POOL_MAX=2 here); its next read fails.
The response must end cut (never a traceback nor a 500 page spliced into the body), and
what it held be given back then. Before, Django's handler never closed a response whose
streaming raised: its pool connection was never given back, and after two such pages
every request of the process waited 10 s for a connection and was a 500."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from tests.audit.chains import bulk_chain
from tests.redteam.test_rt7audit_live_page_slots import _send, _status
from tests.redteam.test_rtaudit_export_pacing import _auditor_cookie, committed  # noqa: F401
from tests.support.live import daphne, free_port, live_env

pytestmark = pytest.mark.timeout(600)

EVENTS = 3000
PAD = "x" * 600  # a replay of about 3 MB: streamed past its first MiB


@pytest.fixture(scope="module")
def port(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    if connection.vendor != "postgresql":
        pytest.skip("ends the page's PostgreSQL connection from the server's side")
    tmp: Path = tmp_path_factory.mktemp("rt8mid")
    env = {
        **live_env(tmp),
        "HARNESS_MAX_EXPORTS": "4",
        "HARNESS_MAX_EXPORTS_PER_PERSON": "1",
        "HARNESS_MAX_EXPORTS_PER_TEAM": "0",
        # Two connections: a page that failed and kept its connection out of the pool
        # leaves the next ones waiting for one.
        "HARNESS_DB_POOL_MIN": "1",
        "HARNESS_DB_POOL_MAX": "2",
    }
    number = free_port()
    with daphne(env, number, tmp / "daphne.log"):
        yield number


def _end_page_connection() -> int:
    """End the daphne's connection that reads the page: of this test's database's others
    than the test's own, the one that ran a statement last (the page's view has just run
    its own; the pool's others are idle since earlier requests)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM ("
            " SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'"
            " ORDER BY query_start DESC NULLS LAST LIMIT 1) AS page"
        )
        return int(cursor.fetchone()[0])


def _rest(sock: socket.socket) -> bytes:
    sock.settimeout(60)
    body = b""
    try:
        while chunk := sock.recv(65536):
            body += chunk
    except ConnectionResetError:
        pass
    return body


@pytest.mark.usefixtures("committed")
@pytest.mark.parametrize("page", ["replay/", "export.jsonl"])
def test_a_page_whose_database_fails_mid_stream_ends_cut_and_gives_back_what_it_held(
    port: int, page: str
) -> None:
    chain = bulk_chain(EVENTS, pad=PAD)
    cookie = _auditor_cookie()
    url = f"/audit/sessions/{chain}/{page}"
    for _ in range(3):  # more than the pool holds
        reading = _served(port, url, cookie)
        assert _end_page_connection() == 1
        body = _rest(reading)
        reading.close()
        assert b"</html>" not in body[-200:], "a page whose database failed must not read whole"
        for leak in (b"Traceback", b"Internal Server Error", b"OperationalError", b"psycopg"):
            assert leak not in body, leak
    _served(port, url, cookie).close()


def _served(port: int, url: str, cookie: str) -> socket.socket:
    """The page, being served (200). The person's one slot is back within seconds of a
    page's failure (its view has ended), not whenever a garbage collection frees the failed
    response: a 503 is asked again meanwhile (so is one while a page left unread a moment
    before still runs); and the page's connection is taken from the pool (a 500 after
    waiting 10 s for one, before)."""
    deadline = time.monotonic() + 15
    while True:
        sock = _send(port, url, cookie)
        status = _status(sock)
        if b" 503 " not in status or time.monotonic() > deadline:
            break
        sock.close()
        time.sleep(0.3)
    assert b" 200 " in status, status
    return sock
