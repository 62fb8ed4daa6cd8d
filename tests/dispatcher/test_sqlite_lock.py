"""floor.sqlite3: the embedded default's transactions take SQLite's write lock by trying
again at short intervals, not by SQLite's sleeping busy handler; with the same timeout and
the same error when it runs out."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings

from floor.sqlite3.base import DatabaseWrapper, begin


def connect(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, timeout=20, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA journal_mode=WAL")
    return connection


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "lock.sqlite3"
    with connect(path) as connection:
        connection.execute("CREATE TABLE t (v TEXT)")
    return path


@pytest.mark.django_db
def test_the_embedded_default_uses_it() -> None:
    if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        pytest.skip("PostgreSQL: no SQLite write lock")
    from django.db import connections

    connection = connections["default"]

    assert isinstance(connection, DatabaseWrapper)
    assert connection.transaction_mode == "IMMEDIATE"


@pytest.mark.backend_independent
def test_waits_for_the_lock_and_takes_it_when_released(database: Path) -> None:
    holder, waiter = connect(database), connect(database)
    holder.execute("BEGIN IMMEDIATE")
    trying = threading.Event()
    taken: list[str] = []

    def take() -> None:
        trying.set()
        begin(waiter, "BEGIN IMMEDIATE", timeout=20)
        waiter.execute("INSERT INTO t VALUES ('waiter')")
        waiter.execute("COMMIT")
        taken.append("waiter")

    thread = threading.Thread(target=take)
    thread.start()
    trying.wait()
    holder.execute("INSERT INTO t VALUES ('holder')")
    holder.execute("COMMIT")  # the waiter's next short try takes it
    thread.join(timeout=20)
    assert taken == ["waiter"]
    rows = [row[0] for row in holder.execute("SELECT v FROM t")]
    assert rows == ["holder", "waiter"]
    # SQLite's own handler is back for whatever runs outside a transaction.
    assert waiter.execute("PRAGMA busy_timeout").fetchone() == (20000,)


@pytest.mark.backend_independent
def test_gives_up_after_its_timeout_with_sqlites_error(database: Path) -> None:
    holder, waiter = connect(database), connect(database)
    holder.execute("BEGIN IMMEDIATE")
    began = time.monotonic()
    with pytest.raises(sqlite3.OperationalError, match="database is locked"):
        begin(waiter, "BEGIN IMMEDIATE", timeout=0.3)
    assert time.monotonic() - began >= 0.3
    assert waiter.execute("PRAGMA busy_timeout").fetchone() == (300,)
    holder.execute("ROLLBACK")
    begin(waiter, "BEGIN IMMEDIATE", timeout=0.3)  # free again: taken at once
    waiter.execute("ROLLBACK")


@pytest.mark.backend_independent
def test_other_errors_are_not_retried(database: Path) -> None:
    waiter = connect(database)
    waiter.execute("BEGIN")
    with pytest.raises(sqlite3.OperationalError, match="within a transaction"):
        begin(waiter, "BEGIN IMMEDIATE", timeout=20)
