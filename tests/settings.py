"""Test settings: the real settings plus tools that only tests register."""

import os
import shutil
import tempfile
from pathlib import Path

# Under pytest-xdist (`make test-fast` runs two workers), each worker is a test session of
# its own: its own data directory, so its own embedded Redis and SQLite files.
# (A process a worker starts inherits both and is in the worker's directory already.)
_WORKER, _DATA = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("HARNESS_DATA_DIR")
if _WORKER and _DATA and Path(_DATA).name != _WORKER:
    os.environ["HARNESS_DATA_DIR"] = str(Path(_DATA) / _WORKER)
# ... and, on a shared Redis, a database of its own (gw0 the one given, gw1 the one below):
# keys by agent id (rates, waits held) and pub/sub names (pushes, wake-ups, which carry the
# database number) never meet another worker's, whose agents have the same ids.
_REDIS_URL = os.environ.get("REDIS_URL", "")
if _WORKER and _REDIS_URL and not os.environ.get("HARNESS_TEST_REDIS_WORKER"):
    _base, _, _number = _REDIS_URL.rpartition("/")
    if _number.isdigit() and "://" in _base:
        os.environ["REDIS_URL"] = f"{_base}/{(int(_number) - int(_WORKER[2:])) % 16}"
        os.environ["HARNESS_TEST_REDIS_WORKER"] = _WORKER

# ... and pub/sub names of its own (the processes it starts inherit them): two test runs on
# one Redis database, such as two `make test`s side by side, would otherwise push into each
# other's sockets (groups named by team and user id, which both runs' databases share).
os.environ.setdefault("HARNESS_CHANNEL_PREFIX", f"harness-test-{os.getpid()}")
os.environ.setdefault("HARNESS_WAKE_PREFIX", f"harness-test-{os.getpid()}:wake")

# ... and one idle PostgreSQL connection per process, not two (the processes it starts
# inherit it; the live stack's also hold fewer at most: tests/conftest.py, live_stack).
os.environ.setdefault("HARNESS_DB_POOL_MIN", "1")

from harness_site.settings import *  # noqa: E402, F403
from harness_site.settings import HARNESS_TOOLS  # noqa: E402

# Tests clear the cache between them (allauth's counts); RedisCache.clear() would flush the
# whole Redis database that other test runs on this machine share. Each test process
# keeps its own; tests/test_site.py checks the production cache against the real Redis.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

HARNESS_TOOLS = [
    *HARNESS_TOOLS,
    "tests.support.tools.SLEEP",
    "tests.support.tools.SLOW_WRITE",
    "tests.support.tools.CLIENT_NOTE",
]

# Each test run gets its own Celery queue on the shared Redis; live processes inherit it.
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("HARNESS_CELERY_QUEUE") or f"harness-test-{os.getpid()}"
# ... and its own background lane, derived from it (live workers consume both).
HARNESS_CELERY_BACKGROUND_QUEUE = (
    os.environ.get("HARNESS_CELERY_BACKGROUND_QUEUE") or f"{CELERY_TASK_DEFAULT_QUEUE}-background"
)
CELERY_TASK_ROUTES = {task: {"queue": HARNESS_CELERY_BACKGROUND_QUEUE} for task in BACKGROUND_TASKS}  # noqa: F405

# Short leases so a killed worker's call ends outcome_unknown within seconds in tests.
HARNESS_LEASE_GRACE = 1.0

# A test database per run, so that concurrent runs on one machine never collide.
_RUN = os.environ.get("HARNESS_TEST_RUN") or str(os.getpid())
if DATABASES["default"]["ENGINE"].endswith("postgresql"):  # noqa: F405
    DATABASES["default"]["TEST"] = {"NAME": f"test_harness_{_RUN}"}  # noqa: F405
else:
    DATABASES["default"]["TEST"] = {"NAME": DATA_DIR / f"test-harness-{_RUN}.sqlite3"}  # noqa: F405

# Sessions' fresh workspaces go to a scratch directory, not the developer's var/.
HARNESS_WORKSPACE_ROOT = Path(
    os.environ.get("HARNESS_WORKSPACE_ROOT")
    or Path(tempfile.gettempdir()) / f"harness-test-workspaces-{_RUN}"
)

# The sandbox (issue 11) is on wherever bwrap is installed, and always under CI=true; a
# machine without bwrap runs the rest of the suite with it off (tests/tools skip and say
# how to enable them).
if os.environ.get("CI") != "true" and "HARNESS_SANDBOX" not in os.environ:
    HARNESS_SANDBOX = "bwrap" if shutil.which("bwrap") else "off"
# Small tools/list pages, so MCP clients in tests page through them.
HARNESS_MCP_PAGE_SIZE = 4

# Test processes (and the daphne and workers they start, which load these settings too)
# hash passwords with few PBKDF2 iterations: see tests/support/hashers.py.
PASSWORD_HASHERS = ["tests.support.hashers.QuickPBKDF2PasswordHasher"]
