"""Shared fixtures: personas, agents with tokens, and a live stack (daphne + Celery worker)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from tests.audit.flush import keep_audit_log_on_flush
from tests.support import kinds as _test_kinds  # noqa: F401  (registers the test kinds)
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.factories import AgentFixture, make_agent, make_user, unique
from tests.support.live import (
    LIVE_START_SECONDS,
    LiveStack,
    free_port,
    live_env,
    nobody_listening,
    start_worker,
    stop,
    wait_for_port,
)
from tests.support.paths import ROOT

# The audit table's triggers refuse TRUNCATE/DELETE; transactional tests' flush skips it.
keep_audit_log_on_flush()


@pytest.fixture(scope="session", autouse=True)
def embedded_redis_server() -> Iterator[None]:
    """On the embedded default, the session starts its Redis and stops it at the end
    (also when a test fails or the run is interrupted): `make test` leaves nothing running."""
    from harness_site import embedded_redis

    started = embedded_redis.start_if_embedded()
    yield
    if started:
        embedded_redis.stop(Path(settings.DATA_DIR))


@pytest.fixture(scope="session", autouse=True)
def preview_stores_removed() -> Iterator[None]:
    """The upper layers that the session's previews kept (asks that never ended, which the
    reconciler would sweep in a deployment) are removed at the end."""
    from dispatcher.tools import preview

    root = preview.store_root()
    before = set(root.iterdir()) if root.is_dir() else set()
    yield
    if root.is_dir():
        for path in set(root.iterdir()) - before:
            preview.discard(str(path))


@pytest.fixture(scope="session", autouse=True)
def scratch_workspaces_removed() -> Iterator[None]:
    """The session's scratch workspace root (tests/settings: `harness-test-workspaces-<run>`
    in the temp directory, unless HARNESS_WORKSPACE_ROOT names one) is removed at the end:
    each run left up to a gigabyte of workspaces in /tmp for good."""
    root = Path(settings.HARNESS_WORKSPACE_ROOT)
    ours = (
        "HARNESS_WORKSPACE_ROOT" not in os.environ
        and root.parent == Path(tempfile.gettempdir())
        and root.name.startswith("harness-test-workspaces-")
    )
    yield
    if ours:
        shutil.rmtree(root, ignore_errors=True)


# --- Tests no backend can change ----------------------------------------------------------

# `make test` runs the suite on both backends; a test that touches neither the database nor
# Redis (a reader, a table of rules, a subprocess with its own environment) proves the same
# thing on both, so it carries `pytest.mark.backend_independent` and `make test-pg`
# deselects it (`make test-embedded` and a plain `pytest` run it). The mark is checked:
# such a test may not ask for the database, and connecting to Redis fails it.
DATABASE_FIXTURES = frozenset(
    {"db", "transactional_db", "live_stack", "live_db", "live_agent", "agent", "reviewer"}
)


# A test that starts the live stack (a real daphne and Celery worker) says so with a mark
# `make test-fast` leaves out: unmarked, it would start both in the one-minute loop.
LIVE_FIXTURES = frozenset({"live_stack", "live_db", "live_agent"})
LIVE_MARKS = ("live", "browser", "slow", "battery")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _live_goes_last(items)
    for item in items:
        _check_live_mark(item)
        _live_start_not_timed_as_the_test(item)
        if item.get_closest_marker("backend_independent") is None:
            continue
        uses = DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
        if uses or item.get_closest_marker("django_db"):
            raise pytest.UsageError(
                f"{item.nodeid} is marked backend_independent but uses the database"
                f" ({', '.join(sorted(uses)) or 'django_db'}): drop the mark"
            )


# The first live test on an xdist worker also starts the session's live stack (a daphne
# and a Celery worker), within the test's own pytest-timeout: on CI's loaded 2-core host a
# cold Celery worker once took past 120 s to say "ready.", and both live tests of that
# xdist worker errored. A live test's timeout is its own plus the stack's two start bounds
# (tests/support/live.py: LIVE_START_SECONDS for daphne, then for the worker), so a start
# the stack itself would wait for is not cut short by the test's.
def _live_start_not_timed_as_the_test(item: pytest.Item) -> None:
    if not LIVE_FIXTURES & set(getattr(item, "fixturenames", ())):
        return
    marker = item.get_closest_marker("timeout")
    seconds = marker.args[0] if marker is not None and marker.args else None
    if marker is not None and seconds is None:
        seconds = marker.kwargs.get("timeout")
    if seconds is None:
        seconds = float(item.config.getini("timeout") or 0)
    if seconds:  # (0: no timeout at all, kept)
        item.add_marker(pytest.mark.timeout(float(seconds) + 2 * LIVE_START_SECONDS), append=False)


def _check_live_mark(item: pytest.Item) -> None:
    uses = LIVE_FIXTURES & set(getattr(item, "fixturenames", ()))
    if uses and not any(item.get_closest_marker(mark) for mark in LIVE_MARKS):
        raise pytest.UsageError(
            f"{item.nodeid} uses the live stack ({', '.join(sorted(uses))}) but is not"
            " marked live: add @pytest.mark.live"
        )


# pytest-django runs the tests marked django_db first, then the transactional ones, then
# the unmarked ones. A live test must go out with the unmarked ones, last: once started,
# the live stack's Celery worker runs any queued call in the shared test database, so a
# live test among the others (a module or class marked django_db(transaction=True)) made
# it run the calls that the tests after it meant to stay queued (CI, 2026-12-07: five
# failed). Such a test sits in its own unmarked module, as
# tests/agentauth/test_token_revocation_live.py does.
DATABASE_ORDER_FIXTURES = frozenset({"db", "transactional_db", "live_server"})


def _live_goes_last(items: list[pytest.Item]) -> None:
    wrong = [f"  {item.nodeid}: {why}" for item in items if (why := _ordered_before_live(item))]
    if wrong:
        raise pytest.UsageError(
            "These tests use the live stack but pytest-django runs them before the unmarked"
            " tests, so its Celery worker runs the queued calls of the tests after them:\n"
            + "\n".join(wrong)
            + "\nMove each to its own unmarked module (no django_db mark), as"
            " tests/agentauth/test_token_revocation_live.py is."
        )


def _ordered_before_live(item: pytest.Item) -> str:
    """Why pytest-django puts this live test before the unmarked ones, or "" (it does not,
    or the test is not live)."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if not LIVE_FIXTURES & fixtures:
        return ""
    marker = item.get_closest_marker("django_db")
    if marker is not None:
        transactional = marker.kwargs.get("transaction") or marker.kwargs.get("reset_sequences")
        return "marked django_db(transaction=True)" if transactional else "marked django_db"
    if ordering := sorted(DATABASE_ORDER_FIXTURES & fixtures):
        return f"uses {', '.join(ordering)}"
    return ""


@pytest.fixture(autouse=True)
def _backend_independent_touches_no_redis(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if request.node.get_closest_marker("backend_independent") is None:
        return
    import redis.asyncio.connection
    import redis.connection

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a backend_independent test connected to Redis: drop the mark")

    monkeypatch.setattr(redis.connection.AbstractConnection, "connect", refuse)
    monkeypatch.setattr(redis.asyncio.connection.AbstractConnection, "connect", refuse)


@pytest.fixture(autouse=True)
def _device_code_counts_cleared(request: pytest.FixtureRequest) -> Iterator[None]:
    """Device codes asked for are counted per address (agentauth.views), and every test
    client asks from 127.0.0.1, in this process's cache: a test that can ask for codes (one
    with the database: tests/agentauth, tests/redteam) starts and ends with none counted
    there, so it is never refused for the codes tests before it asked for."""
    uses = DATABASE_FIXTURES & set(getattr(request.node, "fixturenames", ()))
    if not uses and request.node.get_closest_marker("django_db") is None:
        yield
        return
    from tests.agentauth.device_counts import TEST_CLIENT_ADDRESS, clear_device_code_counts

    clear_device_code_counts(TEST_CLIENT_ADDRESS)
    yield
    clear_device_code_counts(TEST_CLIENT_ADDRESS)


# --- Pooled PostgreSQL connections ------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _socket_tests_close_their_connections() -> None:
    """channels' test communicator turns channels.db's close_old_connections into a no-op
    while it sends to or reads from a consumer (so that a TestCase's connection is not
    closed inside its transaction). Our socket tests are transactional or live, and the
    consumers' reads run in other threads: asgiref's shared sync thread and, for
    thread_sensitive=False reads (audit.consumers' still_active, before every push), the
    test loop's executor threads, which end with the loop. Each such thread kept its
    pooled connection checked out, and one that ended lost it from the pool for good
    (CI, stop 57: late tests of one worker waited 10 s for a connection). Here the
    communicator closes what channels closes in production, except a connection inside a
    transaction (a TestCase's)."""
    from channels.testing import application

    if not callable(getattr(application, "no_op", None)):
        raise pytest.UsageError(
            "channels.testing.application.no_op is gone: see tests/conftest.py,"
            " _socket_tests_close_their_connections"
        )
    application.no_op = _close_old_connections_outside_transactions


def _close_old_connections_outside_transactions() -> None:
    """channels' close_old_connections (CONN_MAX_AGE is 0: each is closed, given back to
    the pool), but never a connection inside a transaction."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


@pytest.fixture(autouse=True)
def _pooled_connections_given_back(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test gives back every pooled connection its threads took: after it, no more are
    checked out of the process's pool than before (this thread's own aside). A thread that
    ends holding one never gives it back, and once the pool's max_size are out, every later
    test waits 10 s for one and fails, far from the test that leaked them. Threads the test
    started may still be finishing: they are waited for (bounded) before the count."""
    if not _pooled():
        yield
        return
    pool = _pool()
    threads = set(threading.enumerate())
    before = _checked_out(pool)
    yield
    _shared_sync_thread_closes_its_connections()
    after_pool = _pool()
    if after_pool is None or (pool is not None and after_pool is not pool):
        return  # (the pool was closed or replaced: a setting changed, the session ended)
    after = _settled_checked_out(after_pool, before, threads)
    if after > before:
        stats = after_pool.get_stats()
        pytest.fail(
            f"{request.node.nodeid} left {after - before} pooled PostgreSQL connection(s)"
            f" checked out ({before} before it, {after} after; pool {stats}): a thread used"
            " the ORM and ended without connections.close_all(). Run it with"
            " `-p tests.support.pool_trace` to see which thread took them, and where.",
            pytrace=False,
        )


def _shared_sync_thread_closes_its_connections() -> None:
    """asgiref's shared sync thread lives as long as the process and runs every
    thread-sensitive sync_to_async outside a request (a test's own asyncio.run, channels'
    consumers): the connection it opened for one test is closed after it, not kept for the
    process, so that no test is counted for another's."""
    from asgiref.sync import SyncToAsync

    closed = SyncToAsync.single_thread_executor.submit(_close_old_connections_outside_transactions)
    with contextlib.suppress(concurrent.futures.TimeoutError):
        closed.result(5)  # (busy past that: _shared_sync_thread_left_free names the test)


def _pooled() -> bool:
    return "pool" in settings.DATABASES["default"].get("OPTIONS", {})


def _pool() -> Any:
    """The process's pool for "default", None before any connection opened it."""
    from django.db import connections

    return type(connections["default"])._connection_pools.get("default")  # type: ignore[attr-defined]


def _checked_out(pool: Any) -> int:
    """Connections out of `pool` now, other than this thread's own."""
    if pool is None:
        return 0
    from django.db import connection

    stats = pool.get_stats()
    mine = 1 if connection.connection is not None else 0
    return int(stats.get("pool_size", 0) - stats.get("pool_available", 0)) - mine


def _settled_checked_out(pool: Any, before: int, threads: set[threading.Thread]) -> int:
    """The count once the test's own threads have ended (each waited for, 10 s in all) and
    the pool has put back what they returned (it checks a returned connection in a thread
    of its own: a short bounded poll of its stats, only when the count is still high)."""
    after = _checked_out(pool)
    if after <= before:
        return after
    deadline = time.monotonic() + 10
    for thread in set(threading.enumerate()) - threads:
        if not thread.name.startswith(f"{pool.name}-"):  # (not the pool's own workers)
            thread.join(max(0.0, deadline - time.monotonic()))
    while (after := _checked_out(pool)) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    return after


# --- asgiref's one shared sync thread --------------------------------------------------


@pytest.fixture(autouse=True)
def _shared_sync_thread_left_free() -> Iterator[None]:
    """A test leaves asgiref's process-wide sync thread free (the one thread every
    thread-sensitive sync_to_async outside a request runs on: channels' consumers read the
    database there, so a later test's in-process WebSocket would hang waiting for it).
    Issue 35: two socket tests once timed out after other tests in one process; a test that
    leaves the thread busy is named here, with every thread's stack, not three files later."""
    yield
    import faulthandler
    import tempfile
    import threading

    from asgiref.sync import SyncToAsync

    free = threading.Event()
    SyncToAsync.single_thread_executor.submit(free.set)
    if free.wait(5):
        return
    with tempfile.TemporaryFile("w+") as dump:
        faulthandler.dump_traceback(file=dump, all_threads=True)
        dump.seek(0)
        stacks = dump.read()
    pytest.fail(f"asgiref's shared sync thread is still busy after this test:\n{stacks}")


# --- Personas ---------------------------------------------------------------------------


@pytest.fixture
def down_url() -> Iterator[str]:
    """A Harness URL nobody answers at: connections are refused for the whole test."""
    with nobody_listening() as url:
        yield url


@pytest.fixture
def agent(db: None) -> AgentFixture:
    return make_agent(mode="standard")


@pytest.fixture
def reviewer(db: None) -> User:
    return make_user(unique("reviewer"), groups=("reviewer",))


# --- Test database ----------------------------------------------------------------------


@pytest.fixture(scope="session")
def django_db_setup(
    request: pytest.FixtureRequest,
    django_test_environment: None,
    django_db_blocker: Any,
    django_db_keepdb: bool,
    django_db_createdb: bool,
    django_db_modify_db_settings: None,
) -> Iterator[None]:
    """pytest-django's setup, but always for "default": live tests carry no django_db mark
    (their processes need committed rows, not a rolled-back transaction), yet need the
    test database too."""
    from django.test.utils import setup_databases, teardown_databases

    keepdb = django_db_keepdb and not django_db_createdb
    with django_db_blocker.unblock():
        db_cfg = setup_databases(verbosity=0, interactive=False, aliases={"default"}, keepdb=keepdb)
    yield
    if not keepdb:
        with django_db_blocker.unblock():
            _disconnect_others()
            teardown_databases(db_cfg, verbosity=0)


def _disconnect_others() -> None:
    """End leftover sessions on the test database (threads of live tests, killed workers)
    so that it can be dropped."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    connection.close()


# --- Live stack -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def live_stack(
    django_db_setup: None, django_db_blocker: object, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveStack]:
    """A real daphne and a real Celery worker on this run's test database and Redis."""
    tmp = tmp_path_factory.mktemp("live")
    # At most 6 PostgreSQL connections in each of the stack's processes (the default is
    # 20): two `make test`s side by side run four such stacks, with their Celery children
    # and test processes, on one server, and used up its max_connections (100: "couldn't
    # get a connection after 10 s"). A request waits for a connection instead.
    env = {"HARNESS_DB_POOL_MAX": "6", **live_env(tmp)}
    port = free_port()
    log = tmp / "daphne.log"
    daphne = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(port),
            "harness_site.asgi:application",
        ],
        env=env,
        cwd=ROOT,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    worker = None
    try:
        wait_for_port(port, daphne, log)
        worker = start_worker(env, tmp)
        stack = LiveStack(url=f"http://127.0.0.1:{port}", env=env, worker=worker, log_dir=tmp)
        yield stack
        worker = stack.worker
    finally:
        stop(daphne, *([worker] if worker is not None else []))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test that used the live stack carries the end of its daphne's and its Celery
    worker's logs: a CI run's failure (a 500, a pool that timed out) is read from the
    report, the stack's files being gone with the machine."""
    report = yield
    stack = getattr(item, "funcargs", {}).get("live_stack")
    if report.failed and isinstance(stack, LiveStack):
        logs = [stack.log_dir / "daphne.log", *sorted(stack.log_dir.glob("worker-*.log"))]
        for log in logs:
            if log.is_file():
                tail = log.read_bytes()[-6000:].decode("utf-8", "replace")
                report.sections.append((f"live stack: end of {log.name}", tail))
    return report


@pytest.fixture
def live_db(live_stack: LiveStack, django_db_blocker: object) -> Iterator[None]:
    """Database access in autocommit, so the live processes see what the test writes.

    Nothing is rolled back: tests that use it create their own users and agents
    (unique names) and assert only on their own rows.
    """
    with django_db_blocker.unblock():  # type: ignore[attr-defined]
        yield


@pytest.fixture
def live_agent(live_db: None) -> AgentFixture:
    """An agent in standard mode, committed to the database."""
    return make_agent(mode="standard")


# --- Browser ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Playwright driving Debian's chromium. Skips (with how to enable) unless CI=true.

    Module-scoped on purpose: Playwright's sync API keeps an event loop running in this
    thread for as long as it is open, and under a running loop Django's test client
    cannot call an async view (AsyncToSync refuses) and the ORM refuses to run. Closing it
    at the end of each browser module keeps that from leaking into the tests after it.
    """
    if not Path(CHROMIUM).exists():
        message = "Browser tests need Debian's chromium: `apt-get install chromium` (make test installs it)."
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and " + message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    # The test's own ORM calls are plain synchronous calls made beside Playwright's loop.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            instance = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield instance
            instance.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous
