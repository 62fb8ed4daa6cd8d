"""A daphne of its own whose environment configures single sign-on (the shared live
stack's does not), on this run's database and Redis."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.live import free_port, live_env, stop, wait_for_port
from tests.support.paths import ROOT


@contextmanager
def daphne_with(env_extra: dict[str, str], tmp: Path) -> Iterator[str]:
    """Its base URL while it runs."""
    env = live_env(tmp) | env_extra
    port = free_port()
    log = tmp / f"daphne-sso-{port}.log"
    proc = subprocess.Popen(
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
    try:
        wait_for_port(port, proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)
