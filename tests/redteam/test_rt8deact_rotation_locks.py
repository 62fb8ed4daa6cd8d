"""Red team (rt8deact): a token shown in the dashboard (the rotate view) against the
deactivation that must void it, and against the same person's approval of the agent's
call.

The deactivation's void reads the agents whose token_holders name the leaver without a
lock, then locks those. A rotation that shows a token to the leaver and commits between
the two would leave it working. It cannot: the rotation locks the row of the person it
shows the token to first (agents._lock_active), and the deactivation's first write is an
UPDATE of that row, so one waits for the other. The rotation first: the deactivation
waits for its commit, then reads the holders (a later statement, a later snapshot) and
voids the token shown. The deactivation first: the rotation waits for its commit, then
refuses a deactivated person. An approval of one of the agent's calls by the person
rotating its token (a second tab) waits for the rotation at its commit (its reference to
the person's row), and both end: no deadlock.

Real requests (the rotate view, the queue's decide view, manage.py deactivate_user),
ordered by pg_blocking_pids; another transaction holds the agent's row FOR KEY SHARE, as
a worker's claim in flight does, so that the first of the two waits with the person's row
locked. (These pass before and after: they hold the order; with the person's row not
locked by the rotation, the deactivation does not wait and the rotation-first case fails.)"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import Client

from approvals.models import ApprovalRequest
from audit.models import AuditEvent
from dispatcher import agents
from dispatcher.models import Agent, Status
from tests.approvals.conftest import ask
from tests.support.factories import make_agent, make_user, unique

pytestmark = pytest.mark.django_db(transaction=True)


def _pid() -> int:
    connection.ensure_connection()
    return int(connection.connection.info.backend_pid)


def _blocked_or(pid_box: list[int], done: threading.Event) -> bool:
    """Wait until the backend in `pid_box` waits on a lock (True) or `done` is set (False)."""
    with connections["default"].cursor() as cursor:
        for _ in range(6000):
            if done.is_set():
                return False
            if pid_box:
                cursor.execute("SELECT cardinality(pg_blocking_pids(%s))", [pid_box[0]])
                if cursor.fetchone()[0]:
                    return True
            done.wait(0.01)
    raise AssertionError("neither blocked nor done")


class Worker:
    """`work` in a thread with its own connection: its pid, its result, its failure."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.pid: list[int] = []
        self.done = threading.Event()
        self.result: Any = None
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(work,))
        self.thread.start()

    def _run(self, work: Callable[[], Any]) -> None:
        try:
            self.pid.append(_pid())
            self.result = work()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            self.failure = error
        finally:
            self.done.set()
            connections.close_all()

    def blocked(self) -> bool:
        return _blocked_or(self.pid, self.done)

    def join(self) -> None:
        self.thread.join(120)
        assert not self.thread.is_alive()


class ClaimInFlight:
    """A transaction holding the agent's row FOR KEY SHARE, as a worker's claim does
    (transitions.live_credential_sql(hold=True)), until released."""

    def __init__(self, agent: Agent) -> None:
        self.held, self.release = threading.Event(), threading.Event()
        table = connection.ops.quote_name(Agent._meta.db_table)

        def hold() -> None:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR KEY SHARE", [agent.pk])  # noqa: S608
                self.held.set()
                assert self.release.wait(120)

        self.worker = Worker(hold)
        assert self.held.wait(60)

    def end(self) -> None:
        self.release.set()
        self.worker.join()
        assert self.worker.failure is None


def _signed_in(person: Any) -> Client:
    client = Client()
    client.force_login(person)
    return client


def _shown(page: bytes) -> str:
    text = page.decode()
    start = text.index(agents.TOKEN_PREFIX + "_")
    return text[start : start + 60].split("<", 1)[0].split()[0].strip("\"'")


@pytest.fixture
def postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks across connections: PostgreSQL (SQLite has one writer)")


@pytest.mark.usefixtures("postgresql")
def test_an_admin_rotating_a_token_while_approving_its_agents_call_ends_both() -> None:
    fx = make_agent(mode="standard")
    approval = ask(fx, {"path": "a.txt", "content": "x"})
    lee = make_user(unique("lee"), groups=("admin", "reviewer"))
    tab, other_tab = _signed_in(lee), _signed_in(lee)  # (a sign-in writes lee's row)
    claim = ClaimInFlight(fx.agent)
    decision = None
    try:
        rotation = Worker(lambda: tab.post(f"/agents/{fx.agent.pk}/rotate", secure=True))
        assert rotation.blocked(), "the rotation did not wait for the claim in flight"
        decision = Worker(
            lambda: other_tab.post(
                f"/approvals/{approval.pk}/decide",
                {"action": "approve", "digest": approval.call.digest},
                secure=True,
            )
        )
        # The approval's commit waits for the rotation (lee's row), never the reverse.
        assert decision.blocked() or decision.done.is_set()
    finally:
        claim.end()
        rotation.join()
        if decision is not None:
            decision.join()
    assert rotation.failure is None, f"the rotation failed: {rotation.failure!r}"
    assert decision is not None and decision.failure is None, (
        f"the decision failed: {decision.failure!r}"
    )
    assert rotation.result.status_code == 200, rotation.result.content[:500]
    assert decision.result.status_code in (200, 302), decision.result.content[:500]
    approval = ApprovalRequest.objects.select_related("call").get(pk=approval.pk)
    assert approval.decision == "approved"
    assert approval.call.status in (Status.QUEUED, Status.DENIED)
    assert agents.authenticate_token(_shown(rotation.result.content)) == fx.agent


@pytest.mark.usefixtures("postgresql")
@pytest.mark.parametrize("first", ["rotation", "deactivation"])
def test_a_token_rotated_for_someone_being_deactivated_never_works_after(first: str) -> None:
    """Whichever commits first: a rotation that showed a token to someone being deactivated
    commits before the deactivation's read of their tokens (it waits for the rotation on
    their row), which voids it; or the deactivation commits first and the rotation, which
    waited for it on their row, shows them nothing."""
    fx = make_agent(mode="standard")
    lee = make_user(unique("lee"), groups=("admin",))
    tab = _signed_in(lee)  # (a sign-in writes lee's row)
    claim = ClaimInFlight(fx.agent)
    rotation = deactivation = None
    try:
        if first == "rotation":
            rotation = Worker(lambda: tab.post(f"/agents/{fx.agent.pk}/rotate", secure=True))
            assert rotation.blocked(), "the rotation did not wait for the claim in flight"
            deactivation = Worker(lambda: call_command("deactivate_user", lee.username))
            assert deactivation.blocked(), "the deactivation did not wait for the rotation"
            assert rotation.pid[0] in _blockers(deactivation.pid[0])
        else:
            owner_agent = agents.create_agent(owner=lee, name=unique("own"), actor="test")[0]
            second = ClaimInFlight(owner_agent)  # the deactivation waits with lee's row held
            try:
                deactivation = Worker(lambda: call_command("deactivate_user", lee.username))
                assert deactivation.blocked()
                rotation = Worker(lambda: tab.post(f"/agents/{fx.agent.pk}/rotate", secure=True))
                assert rotation.blocked(), "the rotation did not wait for the deactivation"
                assert deactivation.pid[0] in _blockers(rotation.pid[0])
            finally:
                second.end()
    finally:
        claim.end()
        for worker in (rotation, deactivation):
            if worker is not None:
                worker.join()
    assert rotation is not None and deactivation is not None
    assert rotation.failure is None and deactivation.failure is None
    lee.refresh_from_db()
    assert not lee.is_active
    page = rotation.result
    if first == "rotation":
        assert page.status_code == 200
        token = _shown(page.content)
        assert agents.authenticate_token(token) is None
        assert agents.voided_refusal(token), "the token shown to lee was not voided"
        event = AuditEvent.objects.filter(kind="user.deactivated").latest("id")
        assert event.payload["agent_tokens_voided"] == [fx.agent.name]
    else:
        # A deactivated person is signed out: the rotate page shows them no token.
        assert agents.TOKEN_PREFIX + "_" not in page.content.decode()
        fx.agent.refresh_from_db()
        assert lee.pk not in (fx.agent.token_holders or [])


def _blockers(pid: int) -> list[int]:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_blocking_pids(%s)", [pid])
        return list(cursor.fetchone()[0])
