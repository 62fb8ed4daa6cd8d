"""The agent API's requests borrow a running thread for their database work instead of
starting one each (harness_site.request_threads; battery row D9)."""

from __future__ import annotations

import threading

from harness_site.request_threads import RequestThreads


def ident_of(pool: RequestThreads) -> int:
    """One request: a thread borrowed, one hop run on it, the thread given back."""
    thread = pool.take()
    try:
        ident: int = thread.submit(threading.get_ident).result(5)
        return ident
    finally:
        pool.give_back(thread)


def test_requests_one_after_another_run_on_one_thread_and_start_none() -> None:
    pool = RequestThreads()
    first = ident_of(pool)
    before = {thread.ident for thread in threading.enumerate()}
    assert {ident_of(pool) for _ in range(50)} == {first}
    # None started (counted by identity: a thread an earlier test left may end meanwhile,
    # as one did in a CI run, 33 threads against 34)
    assert [t.name for t in threading.enumerate() if t.ident not in before] == []


def test_a_thread_with_work_left_is_not_lent_to_the_next_request() -> None:
    pool = RequestThreads()
    release = threading.Event()
    busy = pool.take()
    left = busy.submit(release.wait, 5)  # a hop its request (cancelled) did not wait for
    pool.give_back(busy)
    try:
        assert len(pool) == 0
        other = pool.take()
        assert other is not busy
        assert other.submit(lambda: 42).result(5) == 42  # served at once, not queued
        pool.give_back(other)
    finally:
        release.set()
    assert left.result(5) is True  # the left work finished; its thread then stops
    busy.shutdown(wait=True)
    assert pool.take() is other


def test_idle_threads_past_the_bound_stop() -> None:
    pool = RequestThreads(keep=2)
    threads = [pool.take() for _ in range(4)]
    idents = [t.submit(threading.get_ident).result(5) for t in threads]
    for thread in threads:
        pool.give_back(thread)
    assert len(pool) == 2
    for thread in threads[2:]:
        thread.shutdown(wait=True)  # (stopped already: given back past the bound)
    alive = {t.ident for t in threading.enumerate()}
    assert set(idents[:2]) <= alive
    assert not set(idents[2:]) & alive
