"""Shared fixtures: personas, agents with tokens, and a live stack (daphne + Celery worker)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import User

from audit import roles
from dispatcher import admission, agents
from dispatcher.models import Agent
from dispatcher.policy import profiles
from tests.audit.flush import keep_audit_log_on_flush
from tests.support import kinds as _test_kinds  # noqa: F401  (registers the test kinds)

# The audit table's triggers refuse TRUNCATE/DELETE; transactional tests' flush skips it.
keep_audit_log_on_flush()

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def embedded_redis_server() -> Iterator[None]:
    """On the embedded default, the session starts its Redis and stops it at the end
    (also when a test fails or the run is interrupted): `make test` leaves nothing running."""
    from harness_site import embedded_redis

    started = embedded_redis.start_if_embedded()
    yield
    if started:
        embedded_redis.stop(Path(settings.DATA_DIR))


# --- Tests no backend can change ----------------------------------------------------------

# `make test` runs the suite on both backends; a test that touches neither the database nor
# Redis (a reader, a table of rules, a subprocess with its own environment) proves the same
# thing on both, so it carries `pytest.mark.backend_independent` and `make test-pg`
# deselects it (`make test-embedded` and a plain `pytest` run it). The mark is checked:
# such a test may not ask for the database, and connecting to Redis fails it.
DATABASE_FIXTURES = frozenset(
    {"db", "transactional_db", "live_stack", "live_db", "live_agent", "agent", "reviewer"}
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("backend_independent") is None:
            continue
        uses = DATABASE_FIXTURES & set(getattr(item, "fixturenames", ()))
        if uses or item.get_closest_marker("django_db"):
            raise pytest.UsageError(
                f"{item.nodeid} is marked backend_independent but uses the database"
                f" ({', '.join(sorted(uses)) or 'django_db'}): drop the mark"
            )


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


# --- Personas ---------------------------------------------------------------------------


def make_user(username: str, *, groups: tuple[str, ...] = (), mode: str | None = None) -> User:
    user = User.objects.create_user(username=username, password="pw-" + username)
    for name in groups:
        roles.grant_role(user=user, role=name, actor="test")
    if mode:
        profiles.set_mode(user=user, mode=mode, actor="test")
    return user


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class AgentFixture:
    agent: Agent
    token: str
    owner: User

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def make_agent(
    *, mode: str = "standard", workspace: str = "", owner: User | None = None
) -> AgentFixture:
    owner = owner or make_user(unique("owner"), mode=mode)
    agent, token = agents.create_agent(
        owner=owner, name=unique("agent"), workspace=workspace, actor="test"
    )
    return AgentFixture(agent, token, owner)


def submit_one(session: Any, name: str, arguments: dict[str, Any], tool_use_id: str = "w") -> Any:
    """Admit one native-dialect call in `session` through the service (no HTTP); the call."""
    from dispatcher.gateways.dialects import ProposedCall, canonical_json

    proposed = [ProposedCall(tool_use_id, name, canonical_json(arguments), arguments)]
    [call] = admission.submit_calls(session=session, dialect="native", proposed=proposed)
    return call


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiveStack:
    url: str
    env: dict[str, str]
    worker: subprocess.Popen[bytes]
    log_dir: Path

    def client(self, fixture: AgentFixture, timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=fixture.headers, timeout=timeout)

    def restart_worker(self) -> None:
        self.worker = start_worker(self.env, self.log_dir)


def live_env(tmp: Path) -> dict[str, str]:
    """Environment for subprocesses that share this test run's database and Redis."""
    db = settings.DATABASES["default"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        HARNESS_DATA_DIR=str(settings.DATA_DIR),
        HARNESS_WORKSPACE_ROOT=str(tmp / "workspaces"),
        HARNESS_SECRET_KEY=settings.SECRET_KEY,
        HARNESS_CELERY_QUEUE=settings.CELERY_TASK_DEFAULT_QUEUE,
        HARNESS_CELERY_BACKGROUND_QUEUE=settings.HARNESS_CELERY_BACKGROUND_QUEUE,
        HARNESS_LEASE_GRACE=str(settings.HARNESS_LEASE_GRACE),
        # The live tests' receivers and upstream MCP servers listen on loopback ports made
        # after the stack starts: the outbound door lets this run's processes reach 127.0.0.1.
        HARNESS_OUTBOUND_ALLOW="127.0.0.1",
        # Short, so tests see lingering subscriptions end (test_no_freeze).
        HARNESS_WAKE_LINGER="1",
        PYTHONPATH=str(ROOT),
    )
    if db["ENGINE"].endswith("postgresql"):
        env["DATABASE_URL"] = (
            f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        )
    else:
        env.pop("DATABASE_URL", None)
        env["HARNESS_SQLITE_PATH"] = str(db["NAME"])
    return env


def wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"server did not listen on {port}:\n{log.read_text()[-3000:]}")


def start_worker(
    env: dict[str, str], log_dir: Path, concurrency: int = 4, queues: str = ""
) -> subprocess.Popen[bytes]:
    """A worker on `queues` (comma-separated), by default both lanes of `env`."""
    log = log_dir / f"worker-{time.monotonic_ns()}.log"
    queues = queues or ",".join(
        (env["HARNESS_CELERY_QUEUE"], env["HARNESS_CELERY_BACKGROUND_QUEUE"])
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "harness_site",
            "worker",
            "-P",
            "prefork",
            "-c",
            str(concurrency),
            "-l",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "-Q",
            queues,
        ],
        env=env,
        cwd=ROOT,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120  # a cold start on a loaded 2-core machine is slow
    while "ready." not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"Celery worker did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    return proc


def stop(*procs: subprocess.Popen[bytes]) -> None:
    """SIGTERM every process first, then wait for each (a Celery worker's warm shutdown and
    daphne's overlap instead of adding up); SIGKILL whatever is left after 10 s."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.terminate()
    deadline = time.monotonic() + 10
    for proc in running:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def live_stack(
    django_db_setup: None, django_db_blocker: object, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveStack]:
    """A real daphne and a real Celery worker on this run's test database and Redis."""
    tmp = tmp_path_factory.mktemp("live")
    env = live_env(tmp)
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

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


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


def login(page: object, base_url: str, username: str) -> None:
    """Sign in through the real login form (password is 'pw-' + username, see make_user)."""
    page.goto(f"{base_url}/accounts/login/")  # type: ignore[attr-defined]
    page.fill("input[name=username]", username)  # type: ignore[attr-defined]
    page.fill("input[name=password]", "pw-" + username)  # type: ignore[attr-defined]
    page.click("button[type=submit]")  # type: ignore[attr-defined]
    page.wait_for_load_state()  # type: ignore[attr-defined]
