"""S14's Ha side only (bench/peer_floor.py, BENCH_FLOOR_ASYNC_DJANGO=1): the bench settings
with django-async-backend's PostgreSQL engine (Django's database layer on psycopg's
AsyncConnection: async connections, pool, transactions and cursors), its cursors binding
on the server so psycopg prepares the fixed statements as Harness's `fixed_cursor` does."""

from bench.settings import *  # noqa: F403
from bench.settings import DATABASES, INSTALLED_APPS

DATABASES = {
    **DATABASES,
    "default": {
        **DATABASES["default"],
        "ENGINE": "django_async_backend.db.backends.postgresql",
        "OPTIONS": {**DATABASES["default"].get("OPTIONS", {}), "server_side_binding": True},
    },
}
INSTALLED_APPS = [*INSTALLED_APPS, "django_async_backend"]
ASYNC_BACKEND_DISABLE_POOL_WARNING = True  # (daphne: one event loop for the process)
