"""The export slots' shares (audit.export.SLOTS): a person's and a team's, each named by a
start-up check when it cannot keep anyone out (at or above HARNESS_MAX_EXPORTS, or 0); and
a team's auditors, between them, hold at most HARNESS_MAX_EXPORTS_PER_TEAM of the slots,
so another team's auditor is served beside them. A real daphne, PostgreSQL's COPY, raw
sockets for the downloads that hold their slots."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.core.checks import Warning
from django.db import connection, transaction
from django.test import Client, override_settings

from audit.checks import check_export_shares
from audit.export import LAST_SLOT, ORGANIZATION, Slots
from audit.services import record_event
from dispatcher import agents
from teams.models import Team
from teams.services import add_member, create_team
from tests.redteam.test_rtaudit_export_pacing import _export as _opened
from tests.support.factories import make_user, unique
from tests.support.live import daphne, free_port, live_env

PAD = "p" * 20_000  # an event's payload: 300 of them export as ~6 MB, far past the buffers


def _ids(cap: int, person: int, team: int) -> list[str]:
    """The ids of the checks' messages for these settings (all warnings)."""
    shares = {"HARNESS_MAX_EXPORTS_PER_PERSON": person, "HARNESS_MAX_EXPORTS_PER_TEAM": team}
    with override_settings(HARNESS_MAX_EXPORTS=cap, **shares):
        messages = check_export_shares()
    assert all(isinstance(m, Warning) for m in messages)
    return [m.id for m in messages if m.id]


def test_a_share_that_keeps_nobody_out_is_named_at_start_up() -> None:
    assert _ids(4, 1, 2) == []  # the defaults
    assert _ids(4, 4, 3) == ["audit.W003"]
    assert _ids(4, 0, 5) == ["audit.W003", "audit.W004"]
    assert _ids(0, 0, 0) == []  # no cap at all: no share can take every slot
    with override_settings(
        HARNESS_MAX_EXPORTS=3, HARNESS_MAX_EXPORTS_PER_PERSON=3, HARNESS_MAX_EXPORTS_PER_TEAM=1
    ):
        (message,) = check_export_shares()
    assert "HARNESS_MAX_EXPORTS_PER_PERSON is 3" in message.msg and "one person" in message.msg
    assert message.hint == "Set HARNESS_MAX_EXPORTS_PER_PERSON between 1 and 2."


@override_settings(
    HARNESS_MAX_EXPORTS=4, HARNESS_MAX_EXPORTS_PER_PERSON=0, HARNESS_MAX_EXPORTS_PER_TEAM=2
)
def test_a_teams_share_counts_each_team_an_auditor_reaches_and_the_organization_as_one() -> None:
    slots = Slots()
    first = slots.take("a1", {1, 2})  # an auditor of teams 1 and 2
    second = slots.take("a2", {1})
    assert callable(first) and callable(second)
    assert slots.take("a3", {1}) == "HARNESS_MAX_EXPORTS_PER_TEAM"  # team 1 holds 2
    assert callable(slots.take("b1", {2, 3}))  # team 2 holds 1: 3 running
    org = [slots.take(f"o{n}", [ORGANIZATION]) for n in range(2)]
    assert callable(org[0]) and org[1] == "HARNESS_MAX_EXPORTS"  # 4 running
    second()
    second()  # (a second release gives nothing back)
    # The last free slot is kept for a team that holds none: not the organization's
    # second, but a fourth team's first.
    assert slots.take("o1", [ORGANIZATION]) == LAST_SLOT
    assert slots.refusal("o1", [ORGANIZATION]) == LAST_SLOT  # (asking takes nothing)
    assert callable(slots.take("c1", {4}))  # 4 running
    first()
    assert slots.take("o2", [ORGANIZATION]) == LAST_SLOT
    assert slots.take("b2", {1, 2}) == LAST_SLOT  # team 2 holds b1's
    assert slots.refusal("a3", {1}) is None
    assert callable(slots.take("a3", {1}))  # team 1 holds none again
    assert slots.running == 4


@override_settings(
    HARNESS_MAX_EXPORTS=4, HARNESS_MAX_EXPORTS_PER_PERSON=1, HARNESS_MAX_EXPORTS_PER_TEAM=0
)
def test_without_a_teams_share_no_slot_is_kept() -> None:
    slots = Slots()
    taken = [slots.take(f"o{n}", [ORGANIZATION]) for n in range(5)]
    assert all(callable(t) for t in taken[:4]) and taken[4] == "HARNESS_MAX_EXPORTS"


# ---- A real daphne: one team's auditors cannot hold every slot -------------------------


@pytest.fixture
def committed(django_db_blocker: pytest.FixtureRequest) -> Iterator[None]:
    """Database access in autocommit: the test daphne sees what the test writes."""
    with django_db_blocker.unblock():  # type: ignore[attr-defined]
        yield


@pytest.fixture(scope="module")
def shared_daphne(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A daphne that streams three exports at once, two of one team's: its port."""
    tmp: Path = tmp_path_factory.mktemp("team-share")
    env = {
        **live_env(tmp),
        "HARNESS_RESPONSE_STALL_TIMEOUT": "60",
        "HARNESS_MAX_EXPORTS": "3",
        "HARNESS_MAX_EXPORTS_PER_TEAM": "2",
    }
    env.pop("HARNESS_MAX_EXPORTS_PER_PERSON", None)  # its default, 1
    port = free_port()
    with daphne(env, port, tmp / "daphne.log"):
        yield port


def _team_session(team: Team, events: int) -> str:
    """A session of `team`'s agent whose chain holds `events` padded events: its id."""
    owner = make_user(unique("share-owner"), mode="standard")
    agent, _ = agents.create_agent(owner=owner, name=unique("share-agent"), actor="test", team=team)
    session = agents.start_session(agent=agent)
    with transaction.atomic():
        for n in range(events):
            record_event(
                kind="call.received",
                actor="agent:share",
                subject=f"call:share-{n}",
                session_id=session.pk,
                payload={"call_id": f"share-{n}", "tool": "read_file", "pad": PAD},
            )
    return str(session.pk)


def _auditor_cookie(team: Team) -> str:
    user = make_user(unique("share-auditor"))
    add_member(team=team, user=user, role="auditor", actor="test")
    client = Client()
    client.force_login(user)
    name = settings.SESSION_COOKIE_NAME
    return f"{name}={client.cookies[name].value}"


def _export(port: int, session: str, cookie: str) -> tuple[socket.socket, bytes]:
    """An export whose client reads its head and then nothing (a 200 holds its slot)."""
    sock = _opened(port, session, cookie)
    return sock, sock.recv(4096)


@pytest.mark.heavy
@pytest.mark.timeout(300)
def test_one_teams_auditors_cannot_hold_every_export_slot(
    shared_daphne: int, committed: None
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the export's COPY is PostgreSQL's")
    port = shared_daphne
    pay, infra = (create_team(name=unique(name), actor="test") for name in ("pay", "infra"))
    pay_session, infra_session = _team_session(pay, 300), _team_session(infra, 300)
    pay_auditors = [_auditor_cookie(pay) for _ in range(3)]
    held: list[socket.socket] = []
    try:
        for cookie in pay_auditors[:2]:  # two of pay's auditors each hold an export
            sock, head = _export(port, pay_session, cookie)
            held.append(sock)
            assert head.startswith(b"HTTP/1.1 200 "), head[:300]
        # A third auditor of pay is refused, saying why and what to do (before: served,
        # and pay's auditors held every slot of the process).
        sock, head = _export(port, pay_session, pay_auditors[2])
        held.append(sock)
        assert head.startswith(b"HTTP/1.1 503 "), head[:300]
        assert b"HARNESS_MAX_EXPORTS_PER_TEAM" in head and b"Retry-After: 60" in head, head
        assert b"Your team's auditors" in head, head
        # infra's auditor is served beside them (before: 503, HARNESS_MAX_EXPORTS).
        sock, head = _export(port, infra_session, _auditor_cookie(infra))
        held.append(sock)
        assert head.startswith(b"HTTP/1.1 200 "), head[:300]
    finally:
        for sock in held:
            sock.close()
    # Once pay's downloads are gone, its third auditor is served.
    deadline = time.monotonic() + 30
    while True:
        sock, head = _export(port, pay_session, pay_auditors[2])
        sock.close()
        if head.startswith(b"HTTP/1.1 200 "):
            break
        assert time.monotonic() < deadline, "the closed exports' slots were never given back"
        time.sleep(0.1)
