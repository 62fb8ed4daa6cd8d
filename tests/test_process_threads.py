"""floor.threads.ProcessThreads: one pool per process, made again in a forked child (whose
copy of the parent's pool has no threads to run anything)."""

from __future__ import annotations

import os
import threading

import pytest

from floor.threads import ProcessThreads

pytestmark = pytest.mark.backend_independent


def test_a_process_reuses_its_pool_and_a_forked_child_gets_one_that_runs() -> None:
    threads = ProcessThreads(2, "test-pool")
    pool = threads()
    assert threads() is pool
    assert pool.submit(lambda: threading.current_thread().name).result(5).startswith("test-pool")
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child reports through the pipe)
        try:
            mine = threads()
            answer = mine.submit(lambda: "ran").result(5) if mine is not pool else "same pool"
        except BaseException as exc:  # noqa: BLE001
            answer = repr(exc)
        os.write(write, answer.encode())
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(child, 0)
    assert os.read(read, 200).decode() == "ran" and status == 0
    os.close(read)
