"""Red team (rt8fair) of 2779efb7, the export slots kept fair between teams and the long
page refused before it is read, through a real daphne with the slots' defaults.

A transcript shows a session's calls (their call.received events, with their results):
every other event of the session (the call's decision, its start, its end, the session's
own) adds nothing to it. The early refusal (audit.views._refused_early) counted every
event of the session at TRANSCRIPT_EVENT_BYTES each, so an auditor whose export slot was
in use (one a person, by default) was answered 503 for the transcript of a session of a
few thousand ordinary calls (four events each), a page well under 1 MiB that is answered
whole and takes no slot. Now only the calls are counted."""

from __future__ import annotations

import http.client
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from audit import kinds
from audit.models import AuditEvent
from audit.services import EventSpec, linked_events
from teams.services import create_team
from tests.audit.test_export_fairness import default_daphne  # noqa: F401 (a fixture)
from tests.audit.test_export_shares import (  # noqa: F401 (committed: a fixture)
    _auditor_cookie,
    _export,
    _team_session,
    committed,
)
from tests.support.factories import unique

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300), pytest.mark.usefixtures("committed")]

CALLS = 2500  # 10,000 events: past 8,192 (1 MiB at 128 bytes an event); the page: ~0.5 MiB


def _with_calls(session: str, calls: int) -> None:
    """`calls` ordinary calls appended to the session's chain: each received, allowed,
    started and completed (four events, as the dispatcher records one)."""
    last = AuditEvent.objects.filter(chain=session).order_by("-seq").first()
    assert last is not None
    start = timezone.now()

    def specs() -> list[EventSpec]:
        out = []
        for n in range(calls):
            call = {"call_id": f"c{n}", "tool": "read_file"}
            at = start + timedelta(microseconds=n)
            out += [
                EventSpec(
                    kinds.CALL_RECEIVED, "agent:t", f"call:c{n}", call | {"arguments": "{}"}, at
                ),
                EventSpec(kinds.CALL_ALLOWED, "policy", f"call:c{n}", call, at),
                EventSpec(kinds.CALL_STARTED, "agent:t", f"call:c{n}", call, at),
                EventSpec(
                    kinds.CALL_COMPLETED, "agent:t", f"call:c{n}", call | {"result": "ok"}, at
                ),
            ]
        return out

    events = linked_events(
        specs(), chain=session, session_id=session, seq=last.seq, prev_hash=last.hash
    )
    with transaction.atomic():
        AuditEvent.objects.bulk_create(list(events), batch_size=2000)


def _get(port: int, path: str, cookie: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", path, headers={"Cookie": cookie})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_a_short_transcript_of_many_events_is_served_while_the_persons_slot_is_held(
    default_daphne: int,  # noqa: F811 (the fixture imported above)
) -> None:
    port = default_daphne
    team = create_team(name=unique("calls"), actor="test")
    held_session, session = _team_session(team, 300), _team_session(team, 0)
    _with_calls(session, CALLS)
    assert AuditEvent.objects.filter(chain=session).count() > 4 * CALLS
    cookie = _auditor_cookie(team)
    held: socket.socket | None = None
    try:
        # The auditor's one slot (HARNESS_MAX_EXPORTS_PER_PERSON=1): an export held open.
        held, head = _export(port, held_session, cookie)
        assert head.startswith(b"HTTP/1.1 200 "), head[:300]
        for query in ("", "?format=openai", "?format=anthropic"):
            status, headers, body = _get(
                port, f"/audit/sessions/{session}/transcript/{query}", cookie
            )
            # Before: 503, "HARNESS_MAX_EXPORTS_PER_PERSON", for a page that takes no slot.
            assert status == 200, (query, status, body[:300])
            assert len(body) < 1024 * 1024, (query, len(body))  # answered whole: no slot
            assert headers.get("Content-Length") == str(len(body)), (query, headers)
            assert body.count(b"read_file") >= CALLS, query  # every call of the session
        # What held: its replay (about 440 bytes an event) is long, and refused before it
        # is read, saying why and when to try again.
        status, headers, body = _get(port, f"/audit/sessions/{session}/replay/", cookie)
        assert status == 503, (status, body[:300])
        assert headers.get("Retry-After") == "60", headers
        assert b"HARNESS_MAX_EXPORTS_PER_PERSON" in body, body
    finally:
        if held is not None:
            held.close()
    # ...and once the export is left, its slot comes back and the replay is streamed (past
    # 1 MiB: no Content-Length): the early refusal refused a page that was long.
    deadline = time.monotonic() + 60
    while (replayed := _get(port, f"/audit/sessions/{session}/replay/", cookie))[0] == 503:
        assert time.monotonic() < deadline, replayed[2][:300]
        time.sleep(0.2)
    status, headers, body = replayed
    assert status == 200 and "Content-Length" not in headers, (status, headers)
    assert len(body) > 1024 * 1024, len(body)


def test_auditors_of_many_teams_at_once_take_the_cap_and_refused_ones_leak_no_slot(
    default_daphne: int,  # noqa: F811 (the fixture imported above)
) -> None:
    """Six teams' auditors ask for an export at the same moment: four are served (the cap;
    the last slot to a team holding none), the others refused 503 with Retry-After, never
    a 500, their message naming no team; the refused requests hold nothing, so once the
    four are left four others are served again."""
    port = default_daphne
    teams = [create_team(name=unique(f"many{n}"), actor="test") for n in range(10)]
    sessions = {team.pk: _team_session(team, 300) for team in teams}
    cookies = {team.pk: _auditor_cookie(team) for team in teams}
    socks: list[socket.socket] = []

    def opened(team_pk: int) -> bytes:
        sock, head = _export(port, sessions[team_pk], cookies[team_pk])
        socks.append(sock)
        return head

    try:
        with ThreadPoolExecutor(6) as pool:
            heads = list(pool.map(opened, [team.pk for team in teams[:6]]))
        served = [h for h in heads if h.startswith(b"HTTP/1.1 200 ")]
        refused = [h for h in heads if h.startswith(b"HTTP/1.1 503 ")]
        assert len(served) == 4 and len(refused) == 2, [h[:200] for h in heads]
        for head in refused:
            assert b"Retry-After: 60" in head and b"(HARNESS_MAX_EXPORTS)" in head, head
            assert not any(team.name.encode() in head for team in teams), head
    finally:
        for sock in socks:
            sock.close()
    socks.clear()
    try:
        deadline = time.monotonic() + 60
        for team in teams[6:]:
            while not (head := opened(team.pk)).startswith(b"HTTP/1.1 200 "):
                assert head.startswith(b"HTTP/1.1 503 "), head[:300]
                assert time.monotonic() < deadline, head[:300]  # a slot never came back
                time.sleep(0.2)
    finally:
        for sock in socks:
            sock.close()
