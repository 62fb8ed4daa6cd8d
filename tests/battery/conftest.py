"""The reliability and security battery (docs/reliability.md): fixtures and sizes.

HARNESS_BATTERY_SCALE=ci (default, what `make test` runs) or full (`make battery`).
HARNESS_BATTERY_SEED fixes the seed of every randomized row (each prints SEED=...).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db import connections
from django.test import Client

from tests.battery import figures
from tests.battery.procs import ProcessGroup, RedisServer, Stack
from tests.support.factories import make_user, unique

FULL = figures.scale() == "full"
POSTGRES = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
BACKEND = "postgresql" if POSTGRES else "sqlite"


def size(ci: int, full: int) -> int:
    return full if FULL else ci


def seed_for(row: str) -> int:
    """The row's seed: HARNESS_BATTERY_SEED or a fresh one; printed, and kept in the figures."""
    fixed = os.environ.get("HARNESS_BATTERY_SEED")
    seed = int(fixed) if fixed else random.SystemRandom().randrange(2**32)
    figures.SEEDS[row] = seed
    print(f"SEED={seed} ({row}; rerun with HARNESS_BATTERY_SEED={seed})")
    return seed


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.battery)


@pytest.fixture(scope="session", autouse=True)
def battery_figures() -> Iterator[None]:
    started = time.time()
    figures.begin(BACKEND, started)
    yield
    path = figures.write(BACKEND, started)
    if path is not None:
        print(f"\nbattery figures written to {path}")


@pytest.fixture
def battery_db(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """Autocommit database access shared with the processes a test starts (nothing is
    rolled back: tests create their own users and agents and assert on their own rows)."""
    with django_db_blocker.unblock():
        yield
        connections.close_all()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[ProcessGroup]:
    group = ProcessGroup(tmp_path)
    try:
        yield group
    finally:
        group.stop_all()


@pytest.fixture
def redis_server(procs: ProcessGroup) -> RedisServer:
    return RedisServer(procs)


@pytest.fixture
def stack(procs: ProcessGroup, redis_server: RedisServer, battery_db: None) -> Stack:
    return Stack(procs, redis_server)


def reviewer_client(url: str, username: str | None = None) -> httpx.Client:
    """An httpx client signed in as a fresh reviewer (a real session row), CSRF header set."""
    django_client = Client()
    django_client.force_login(make_user(username or unique("rev"), groups=("reviewer",)))
    name = settings.SESSION_COOKIE_NAME
    client = httpx.Client(
        base_url=url, cookies={name: django_client.cookies[name].value}, timeout=30
    )
    response = client.get("/approvals/")
    assert response.status_code == 200, response.text[:500]
    # The first page saves the session (the sign-in's activity, identity.services): the
    # server's Set-Cookie, for its host, joins the one given above; keep the latest.
    latest = {cookie.name: cookie.value for cookie in client.cookies.jar}
    client.cookies.clear()
    client.cookies.update(latest)
    client.headers["X-CSRFToken"] = client.cookies["csrftoken"]
    client.headers["HX-Request"] = "true"
    return client
