"""An opt-in diagnostic: which test took a pooled PostgreSQL connection that was never given
back, in which thread, from where.

    pytest -p tests.support.pool_trace -p no:randomly tests/...

Every `getconn` of psycopg's pool is recorded with its thread, its test and its stack; every
`putconn` forgets it. After each test, the connections that test took and that are still out
are written to HARNESS_POOL_TRACE (a file; stderr without it), with whether their thread is
still alive (a dead thread's connection is never given back).
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO

import pytest


@dataclass
class Taken:
    thread: threading.Thread
    test: str
    stack: str


_out: dict[int, Taken] = {}
_lock = threading.Lock()
_current = {"test": "(outside any test)"}


def _install() -> None:
    from psycopg_pool import ConnectionPool

    getconn, putconn = ConnectionPool.getconn, ConnectionPool.putconn

    def traced_getconn(self: ConnectionPool, timeout: float | None = None) -> Any:
        conn = getconn(self, timeout)
        stack = "".join(traceback.format_stack(limit=30)[:-1])
        with _lock:
            _out[id(conn)] = Taken(threading.current_thread(), _current["test"], stack)
        return conn

    def traced_putconn(self: ConnectionPool, conn: Any) -> None:
        with _lock:
            _out.pop(id(conn), None)
        putconn(self, conn)

    ConnectionPool.getconn = traced_getconn  # type: ignore[method-assign,assignment]
    ConnectionPool.putconn = traced_putconn  # type: ignore[method-assign,assignment]


def pytest_configure(config: pytest.Config) -> None:
    _install()


def _stream() -> TextIO:
    path = os.environ.get("HARNESS_POOL_TRACE")
    return open(path, "a") if path else sys.stderr  # noqa: SIM115


def _stats() -> str:
    from django.db import connections

    pools = type(connections["default"])._connection_pools  # type: ignore[attr-defined]
    pool = pools.get("default")
    if pool is None:
        return "no pool"
    s = pool.get_stats()
    return (
        f"size={s.get('pool_size')} available={s.get('pool_available')}"
        f" in_use={s.get('pool_size', 0) - s.get('pool_available', 0)}"
        f" waiting={s.get('requests_waiting')}"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _current["test"] = item.nodeid
    before = _stats()
    try:
        return (yield)
    finally:
        _current["test"] = f"(after {item.nodeid})"
        with _lock:
            left = [t for t in _out.values() if t.test == item.nodeid]
        stream = _stream()
        try:
            stream.write(f"POOL {item.nodeid} before: {before} after: {_stats()}\n")
            for taken in left:
                main = taken.thread is threading.main_thread()
                state = "alive" if taken.thread.is_alive() else "DEAD"
                stream.write(
                    f"  LEFT OUT by thread {taken.thread.name!r} ({state}"
                    f"{', main' if main else ''}):\n{taken.stack}\n"
                )
        finally:
            if stream is not sys.stderr:
                stream.close()
