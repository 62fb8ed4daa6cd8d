"""Red team (rt5pace): the audit export's slots (audit.export.SLOTS, HARNESS_MAX_EXPORTS)
are a new resource every auditor of a web process shares. One auditor who opened as many
exports as the process streams at once (a slow reader holds each as long as it takes
anything within HARNESS_RESPONSE_STALL_TIMEOUT, reconnecting when cut) had every other
auditor's export refused 503 for as long as they liked. Now one person holds at most
HARNESS_MAX_EXPORTS_PER_PERSON of them. And an export that fails mid-stream (its database
connection cut) is cut: daphne tried to start a 500 over the started response, which
raised, and left the download open and unfinished, its client waiting for ever on what
did not read as cut; its slot comes back. A real daphne, PostgreSQL's COPY, raw sockets."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from tests.redteam.test_rtaudit_export_pacing import (
    _auditor_cookie,
    _chain,
    _export,
    _get,
    committed,  # noqa: F401 (a fixture)
)
from tests.support.live import daphne, free_port, live_env

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300), pytest.mark.usefixtures("committed")]

EVENTS = 3000  # ~7 MB exported: far more than the sockets' buffers hold


@pytest.fixture(scope="module")
def slotted_daphne(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[int]:
    """A daphne of this run's settings that streams two exports at once: its port."""
    tmp: Path = tmp_path_factory.mktemp("slots")
    env = {
        **live_env(tmp),
        "HARNESS_RESPONSE_STALL_TIMEOUT": "60",
        "HARNESS_MAX_EXPORTS": "2",
        # The person's share alone: these organization-wide auditors are one team, whose
        # share would keep the last slot for another team (tests/audit/test_export_fairness.py)
        "HARNESS_MAX_EXPORTS_PER_TEAM": "0",
    }
    env.pop("HARNESS_MAX_EXPORTS_PER_PERSON", None)  # its default
    port = free_port()
    with daphne(env, port, tmp / "daphne.log"):
        yield port


@pytest.fixture(scope="module")
def big_chain(slotted_daphne: int, django_db_blocker: pytest.FixtureRequest) -> str:
    with django_db_blocker.unblock():  # type: ignore[attr-defined]
        return _chain(EVENTS)


def _held(port: int, chain: str, cookie: str) -> socket.socket:
    """An export whose client reads its head and then nothing: it holds its slot."""
    sock = _export(port, chain, cookie)
    head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 200 "), head[:300]
    return sock


def _pg_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the export's COPY is PostgreSQL's")


def test_one_auditor_cannot_hold_every_export_slot(slotted_daphne: int, big_chain: str) -> None:
    _pg_only()
    port = slotted_daphne
    hoarder, other = _auditor_cookie(), _auditor_cookie()
    small = _chain(20)
    held = [_held(port, big_chain, hoarder)]
    try:
        # The same person opens another export that reads nothing: refused, saying why
        # and what to do (before: served, and it took the process's last slot).
        second = _export(port, big_chain, hoarder)
        held.append(second)
        second_head = second.recv(4096)
        # Another auditor's export is served beside them (before: 503 for as long as the
        # hoarder's readers kept reading a little within the stall bound).
        status, body = _get(port, f"/audit/sessions/{small}/export.jsonl", other)
        assert status == 200 and body.count(b"\n") == 20, body[:300]
        assert second_head.startswith(b"HTTP/1.1 503 "), second_head[:300]
        assert b"HARNESS_MAX_EXPORTS_PER_PERSON" in second_head, second_head
        assert b"Retry-After: 60" in second_head, second_head
    finally:
        for sock in held:
            sock.close()
    # Once the hoarder's download is gone, their next one is served.
    deadline = time.monotonic() + 30
    while _get(port, f"/audit/sessions/{small}/export.jsonl", hoarder)[0] == 503:
        assert time.monotonic() < deadline, "the closed export's slot was never given back"
        time.sleep(0.1)


def test_an_export_that_fails_mid_stream_gives_its_slot_back(
    slotted_daphne: int, big_chain: str
) -> None:
    _pg_only()
    port = slotted_daphne
    cookies = [_auditor_cookie() for _ in range(3)]
    small = _chain(20)
    for cookie in cookies[:2]:  # each export's database connection dies mid-stream
        sock = _held(port, big_chain, cookie)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'COPY (SELECT%%' "
                "AND state = 'active' AND pid <> pg_backend_pid()"
            )
            assert cursor.fetchall(), "no export's COPY was running"
        sock.settimeout(60)  # (before: timed out, nothing more came and nothing ended)
        try:  # the client keeps reading: the export reaches its error, the connection is cut
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        finally:
            sock.close()
    # Both slots are back: a third auditor's export is served.
    deadline = time.monotonic() + 10
    while (answer := _get(port, f"/audit/sessions/{small}/export.jsonl", cookies[2]))[0] != 200:
        assert answer[0] == 503, answer
        assert time.monotonic() < deadline, "a failed export's slot was never given back"
        time.sleep(0.2)
