"""Row-lock races on PostgreSQL: another connection holds a row lock while the work a
test starts in threads of their own waits for it (seen by pg_blocking_pids), then lets
it go. Real connections, real locks; waits end on events, not on the clock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

import pytest
from django.db import connection, connections, transaction


def require_postgresql() -> None:
    """Skip on any other database: row locks across connections are PostgreSQL's
    (SQLite has one writer)."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks across connections: PostgreSQL (SQLite has one writer)")


def _pid() -> int:
    connection.ensure_connection()
    return int(connection.connection.info.backend_pid)


def blocked_or(pid_box: list[int], done: threading.Event) -> bool:
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


def in_thread(work: Callable[[], Any], pid_box: list[int], done: threading.Event) -> Any:
    """(a thread running `work` on a connection of its own, whose backend's pid it puts
    in `pid_box`, setting `done` at its end; the list of what it raised)."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            pid_box.append(_pid())
            work()
        except BaseException as error:  # noqa: BLE001 - reported by the caller
            failures.append(error)
        finally:
            done.set()
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, failures


def blocked_by(pid: int) -> list[int]:
    """The backends waiting on a lock `pid` holds (a request's connection may be another
    each time: found by whom it waits for, not by its own id). Read anew each time: in a
    transaction, pg_stat_activity is what its first read saw (a later backend not in it)."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [pid]
        )
        return [row[0] for row in cursor.fetchall()]


def wait_blocked_by(pid: int, done: threading.Event) -> int:
    """The first backend found waiting on `pid`'s lock; fails if `done` comes first."""
    for _ in range(6000):
        blocked = blocked_by(pid)
        if blocked:
            return blocked[0]
        assert not done.is_set(), "it finished without waiting"
        done.wait(0.01)
    raise AssertionError("nothing waited")


class RowHold:
    """`with RowHold(lock) as hold:` another connection runs `lock` (a query taking row
    locks) in a transaction and holds what it took until the block ends; `hold.start`
    and `hold.waits` run work in threads of their own meanwhile. At the end the hold is
    let go, every thread joined, and (the block ended without an error) none of them
    failed."""

    def __init__(self, lock: Callable[[], object]) -> None:
        self.lock = lock
        self.held, self.release = threading.Event(), threading.Event()
        self.pid: list[int] = []  # (the holder's backend)
        self.threads: list[threading.Thread] = []
        self.failures: list[list[BaseException]] = []

    def _hold(self) -> None:
        with transaction.atomic():
            self.lock()
            self.held.set()
            assert self.release.wait(60)

    def __enter__(self) -> RowHold:
        self.start(self._hold, self.pid)
        try:
            assert self.held.wait(30)
        except BaseException:
            self._end()
            raise
        return self

    def start(
        self, work: Callable[[], object], pid: list[int] | None = None
    ) -> tuple[list[int], threading.Event]:
        """`work` started in a thread of its own: (its backend's pid, when known; the
        event set at its end)."""
        pid = [] if pid is None else pid
        done = threading.Event()
        thread, failed = in_thread(work, pid, done)
        self.threads.append(thread)
        self.failures.append(failed)
        return pid, done

    def waits(self, work: Callable[[], object], what: str) -> list[int]:
        """`work` started; it waits on a lock (or fails saying `what` did not wait):
        its backend's pid."""
        pid, done = self.start(work)
        assert blocked_or(pid, done), f"{what} did not wait"
        return pid

    def _end(self) -> None:
        self.release.set()
        for thread in self.threads:
            thread.join(60)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._end()
        if kind is None:
            assert not any(self.failures), self.failures
