"""Django's SQLite backend, taking the write lock without SQLite's sleeping busy handler.

The embedded default runs daphne and the Celery workers as separate processes over one
SQLite file, and every transaction begins `IMMEDIATE` (it takes the single write lock at
`BEGIN`). When the lock is held, SQLite's own busy handler sleeps on a lengthening
schedule (1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100 ms and then 100 ms at a time)
before trying again: while other processes take the lock back to back with short gaps
between, a waiter that sleeps 50-100 ms at a time keeps missing the gaps. One agent's
burst of writes then held another agent's call for several times its usual time (battery
row D9 on the embedded default; docs/reliability.md).

Here `BEGIN IMMEDIATE` is retried from Python at a short, capped interval instead, up to
the same timeout (`OPTIONS["timeout"]`), and fails with the same "database is locked"
error when it runs out. Everything else (writes in autocommit, checkpoints) keeps SQLite's
handler.

Verified against Django 6.1 (`VERIFIED_WITH`): it overrides the backend's
`_start_transaction_under_autocommit` and reads its `transaction_mode`.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from django.db.backends.sqlite3 import base

# The library lines this module was verified against (dispatcher.W015).
VERIFIED_WITH = {"Django": "6.1"}

FIRST_PAUSE = 0.0002  # seconds: a commit elsewhere is usually this close
LONGEST_PAUSE = 0.002


class DatabaseWrapper(base.DatabaseWrapper):
    transaction_mode: str | None  # set by the parent's get_connection_params
    lock_timeout: float

    def get_connection_params(self) -> dict[str, Any]:
        params: dict[str, Any] = super().get_connection_params()
        self.lock_timeout = float(params.get("timeout", 5))
        return params

    def _start_transaction_under_autocommit(self) -> None:
        statement = f"BEGIN {self.transaction_mode}" if self.transaction_mode else "BEGIN"
        with self.wrap_database_errors:
            begin(self.connection, statement, self.lock_timeout)


def begin(connection: sqlite3.Connection, statement: str, timeout: float) -> None:
    """Run `statement` (a BEGIN that takes the write lock), trying again at short
    intervals while another connection holds the lock, for up to `timeout` seconds."""
    connection.execute("PRAGMA busy_timeout = 0")
    try:
        deadline = time.monotonic() + timeout
        pause = FIRST_PAUSE
        while True:
            try:
                connection.execute(statement)
                return
            except sqlite3.OperationalError as error:
                if not _locked(error) or time.monotonic() >= deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE)
    finally:
        connection.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")


def _locked(error: sqlite3.OperationalError) -> bool:
    return getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY or (
        "locked" in str(error)
    )
