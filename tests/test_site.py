"""The site as a whole: versions, static files served by daphne, security headers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import django
import httpx
import pytest

from tests.support.live import LiveStack


def test_runs_on_django_6_or_later() -> None:
    # Python 3.11 silently installs Django 5.2, which has no built-in CSP.
    assert django.VERSION >= (6, 1)


@pytest.mark.live
@pytest.mark.parametrize(
    "path, content_type",
    [("/static/harness.css", "text/css"), ("/static/vendor/htmx-2.0.11.min.js", "javascript")],
)
def test_daphne_serves_the_static_files(
    live_stack: LiveStack, path: str, content_type: str
) -> None:
    response = httpx.get(live_stack.url + path)
    assert response.status_code == 200
    assert content_type in response.headers["content-type"]


@pytest.mark.live
def test_reviewer_pages_send_a_strict_csp(live_stack: LiveStack) -> None:
    response = httpx.get(live_stack.url + "/accounts/login/")
    csp = response.headers["content-security-policy"]
    assert "script-src 'self' 'nonce-" in csp and "unsafe-inline" not in csp
    assert response.headers["x-frame-options"] == "DENY"


@pytest.mark.live
def test_agent_api_errors_are_json_without_tracebacks(live_stack: LiveStack) -> None:
    response = httpx.post(
        live_stack.url + "/api/v1/sessions", content=b"{", headers={"Authorization": "Bearer x"}
    )
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/json"
    assert "Traceback" not in response.text
    assert response.headers["cache-control"] == "no-store"


@pytest.mark.heavy
def test_importing_settings_starts_no_redis(tmp_path: Path) -> None:
    """mypy, pytest collection and every command import settings: none may start a server."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["HARNESS_DATA_DIR"] = str(tmp_path)
    subprocess.run(
        [sys.executable, "-c", "import harness_site.settings as s; print(s.REDIS_URL)"],
        env=env,
        check=True,
        capture_output=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert not (tmp_path / "redis.sock").exists()
    assert not (tmp_path / "redis.pid").exists()


def _pubsub_names(redis_url: str) -> tuple[str, str]:
    env = {**os.environ, "REDIS_URL": redis_url}
    env.pop("HARNESS_CHANNEL_PREFIX", None)
    env.pop("HARNESS_WAKE_PREFIX", None)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import harness_site.settings as s; "
            "print(s.CHANNEL_LAYERS['default']['CONFIG']['prefix'], s.HARNESS_WAKE_PREFIX)",
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    ).stdout.split()
    return out[0], out[1]


@pytest.mark.heavy
def test_deployments_on_other_redis_databases_never_share_pushes_or_wake_ups() -> None:
    """Redis pub/sub ignores the database number: a reviewer's socket of one deployment
    would otherwise receive another's asks (with what its agents sent)."""
    assert _pubsub_names("redis://127.0.0.1:6379") == ("harness", "harness:wake")
    assert _pubsub_names("redis://127.0.0.1:6379/0") == ("harness", "harness:wake")
    assert _pubsub_names("redis://127.0.0.1:6379/13") == ("harness:db13", "harness:db13:wake")
    assert _pubsub_names("redis://h:6379?db=7") == ("harness:db7", "harness:db7:wake")
    assert _pubsub_names("redis://127.0.0.1:6379/12") != _pubsub_names("redis://127.0.0.1:6379/13")


def test_the_production_cache_is_shared_through_redis() -> None:
    """allauth's rate-limit counts live in Django's cache: in production settings it is
    the Redis every process reaches, so two processes count one person's tries together
    (the test settings keep a per-process cache that tests may clear)."""
    from django.conf import settings
    from django.core.cache.backends.redis import RedisCache

    import harness_site.settings as production
    from tests.support.factories import unique

    conf = production.CACHES["default"]
    assert conf["BACKEND"] == "django.core.cache.backends.redis.RedisCache"
    # Two caches as two processes would build them, on this run's Redis.
    first, second = (RedisCache(settings.REDIS_URL, {**conf}) for _ in range(2))
    key = unique("tries")
    try:
        first.set(key, 3, 60)
        assert first.incr(key) == 4
        assert second.get(key) == 4
    finally:
        first.delete(key)


def test_daphnes_start_up_objects_are_frozen() -> None:
    """What daphne loads at start-up is kept out of garbage collections (harness_site.asgi):
    a full collection walking it stalled every request of the process for about 110 ms."""
    from django.conf import settings

    if getattr(settings, "EMBEDDED_REDIS", False):
        pytest.skip("importing asgi starts the embedded Redis; the PostgreSQL run checks it")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import gc, harness_site.asgi; print(gc.get_freeze_count(), len(gc.get_objects()))",
        ],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "harness_site.settings"},
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    ).stdout.split()
    frozen, tracked = int(out[-2]), int(out[-1])
    assert frozen > 100_000 > tracked, (frozen, tracked)
