"""Red team (rtaudit): a big audit export to a client that reads nothing. daphne handed every
part of a streamed response to Twisted as the application sent it, and Twisted kept what
the client had not read in memory without bound: the web process held the whole export
(the whole log, for an organization's auditor). Now a response is sent no faster than its
client reads (harness_site.slow_clients), and a client that takes nothing for
HARNESS_RESPONSE_STALL_TIMEOUT seconds is cut off, which gives the export's database
connection back. A real daphne, PostgreSQL's COPY, raw sockets."""

from __future__ import annotations

import http.client
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client

from audit import roles
from tests.audit.chains import bulk_chain
from tests.support.live import daphne, free_port, live_env

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600)]

STALL = 4.0  # seconds: the test daphne's HARNESS_RESPONSE_STALL_TIMEOUT
EVENTS = 20_000
PAD = "p" * 2000  # ~2.3 KB an event in the export: ~46 MB in all
GROWTH = 20 * 1024  # KiB: the most the export may add to daphne's peak memory


@pytest.fixture(scope="module")
def paced_daphne(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[int, int]]:
    """A daphne of this run's settings whose responses may stall STALL seconds: (port, pid)."""
    tmp: Path = tmp_path_factory.mktemp("paced")
    env = {
        **live_env(tmp),
        "HARNESS_RESPONSE_STALL_TIMEOUT": str(STALL),
        "HARNESS_MAX_EXPORTS": "1",
    }
    port = free_port()
    with daphne(env, port, tmp / "daphne.log"):
        yield port, _daphne_pid(port)


def _daphne_pid(port: int) -> int:
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # listening
            inode = fields[9]
            break
    else:
        raise AssertionError(f"nothing listens on {port}")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            links = [f.readlink() for f in (proc / "fd").iterdir()]
        except OSError:
            continue
        if Path(f"socket:[{inode}]") in links:
            return int(proc.name)
    raise AssertionError(f"no process holds the socket of port {port}")


def _status(pid: int, field: str) -> int:
    """A figure of /proc/<pid>/status, in KiB (VmRSS, VmHWM: the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


@pytest.fixture
def committed(django_db_blocker: Any) -> Iterator[None]:
    """Database access in autocommit: the test daphne sees what the test writes."""
    with django_db_blocker.unblock():
        yield


def _chain(count: int) -> str:
    return bulk_chain(count, batch_size=2000, pad=PAD)


def _auditor_cookie() -> str:
    name = "rtaudit-pace-" + uuid.uuid4().hex[:8]
    user = User.objects.create_user(username=name, password="pw-" + name)
    with transaction.atomic():
        roles.grant_role(user=user, role="auditor", actor="test")
    client = Client()
    client.force_login(user)
    name = settings.SESSION_COOKIE_NAME
    return f"{name}={client.cookies[name].value}"


def _export(port: int, chain: str, cookie: str) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        f"GET /audit/sessions/{chain}/export.jsonl HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Cookie: {cookie}\r\nConnection: close\r\n\r\n".encode()
    )
    return sock


def _copies() -> int:
    """The exports' COPY statements running now (the test's own database)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'COPY (SELECT%%' AND state = 'active' AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def test_an_export_to_a_client_that_reads_nothing_is_paced_then_cut(
    paced_daphne: tuple[int, int], committed: None
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the export's COPY is PostgreSQL's (SQLite reads a cursor the same way)")
    port, pid = paced_daphne
    cookie = _auditor_cookie()
    # A small export first, read whole: what any request loads is loaded before the peak.
    small_chain = _chain(50)
    assert _get(port, f"/audit/sessions/{small_chain}/export.jsonl", cookie)[0] == 200
    chain = _chain(EVENTS)
    before = _status(pid, "VmHWM")

    sock = _export(port, chain, cookie)
    head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 200 "), head[:300]
    # While it streams, or waits for its client: another export is refused with what to
    # do (the slot holds a database connection), and every other page is served.
    status, body = _get(port, f"/audit/sessions/{small_chain}/export.jsonl", cookie)
    assert status == 503 and b"HARNESS_MAX_EXPORTS" in body and b"Try again" in body
    assert _get(port, "/audit/sessions/", cookie)[0] == 200
    # The client reads nothing more for twice the bound (the stall is what is tested).
    # Paced, the server stops writing once the sockets' buffers are full and, STALL
    # seconds later, aborts the connection: reading then finds what the buffers held and
    # the end. Unpaced, the whole export went into daphne's memory, and reading then
    # received all of it.
    time.sleep(STALL * 2)
    sock.settimeout(STALL * 10)
    received = len(head)
    try:
        while chunk := sock.recv(65536):
            received += len(chunk)
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    grown = _status(pid, "VmHWM") - before
    assert grown < GROWTH, f"daphne's peak memory grew by {grown // 1024} MiB"
    assert received < EVENTS * len(PAD) // 4  # cut off: far from the whole export
    deadline = time.monotonic() + 30
    while _copies() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _copies() == 0  # the export's database connection was given back
    # ... and its slot: the next export is served.
    while _get(port, f"/audit/sessions/{small_chain}/export.jsonl", cookie)[0] == 503:
        assert time.monotonic() < deadline, "the cut export's slot was never given back"
        time.sleep(0.1)


def _get(port: int, path: str, cookie: str) -> tuple[int, bytes]:
    """A GET read whole: its status and body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path, headers={"Cookie": cookie})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()
