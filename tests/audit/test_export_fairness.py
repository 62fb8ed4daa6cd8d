"""Export slots are fair between teams (audit.export.Slots): the last free slot is kept for a
team whose auditors hold none, so with the defaults (4 slots, 2 a team) two teams' auditors
exporting as much as they may no longer hold every slot, and a third team's auditor is
served beside them (before: 503, HARNESS_MAX_EXPORTS, for as long as they kept exporting).
A real daphne with the default shares, raw sockets for the downloads that hold their
slots."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from teams.services import create_team
from tests.audit.test_export_shares import (  # noqa: F401 (committed: a fixture)
    _auditor_cookie,
    _export,
    _team_session,
    committed,
)
from tests.support.factories import unique
from tests.support.live import daphne, free_port, live_env


@pytest.fixture(scope="module")
def default_daphne(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[int]:
    """A daphne with the export slots' defaults (4; 1 a person; 2 a team): its port."""
    tmp: Path = tmp_path_factory.mktemp("fair-slots")
    env = {**live_env(tmp), "HARNESS_RESPONSE_STALL_TIMEOUT": "60"}
    for name in ("", "_PER_PERSON", "_PER_TEAM"):
        env.pop(f"HARNESS_MAX_EXPORTS{name}", None)
    port = free_port()
    with daphne(env, port, tmp / "daphne.log"):
        yield port


@pytest.mark.heavy
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("committed")
def test_a_third_team_is_served_while_two_teams_keep_exporting(default_daphne: int) -> None:
    port = default_daphne
    pay, ops, infra = (create_team(name=unique(n), actor="test") for n in ("pay", "ops", "infra"))
    sessions = {team.pk: _team_session(team, 300) for team in (pay, ops, infra)}
    held: list[socket.socket] = []

    def export(team_pk: int, cookie: str) -> bytes:
        sock, head = _export(port, sessions[team_pk], cookie)
        held.append(sock)
        return head

    try:
        # pay's auditors hold their team's 2 slots, ops's first auditor a third.
        for team, count in ((pay, 2), (ops, 1)):
            for _ in range(count):
                head = export(team.pk, _auditor_cookie(team))
                assert head.startswith(b"HTTP/1.1 200 "), head[:300]
        # ops's second auditor would take the last slot: it is kept for a team holding none.
        ops_second = export(ops.pk, _auditor_cookie(ops))
        # infra's auditor is served beside them (before: ops's second took the last slot,
        # and infra was refused, HARNESS_MAX_EXPORTS).
        infra_head = export(infra.pk, _auditor_cookie(infra))
        assert infra_head.startswith(b"HTTP/1.1 200 "), infra_head[:300]
        assert ops_second.startswith(b"HTTP/1.1 503 "), ops_second[:300]
        assert b"Retry-After: 60" in ops_second, ops_second
        assert b"kept for a team whose auditors are downloading none" in ops_second, ops_second
        # Every slot is held now (three teams): a fourth team waits like anyone.
        late = create_team(name=unique("late"), actor="test")
        sessions[late.pk] = _team_session(late, 1)
        late_head = export(late.pk, _auditor_cookie(late))
        assert late_head.startswith(b"HTTP/1.1 503 "), late_head[:300]
        assert b"(HARNESS_MAX_EXPORTS)" in late_head, late_head
    finally:
        for sock in held:
            sock.close()
