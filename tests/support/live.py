"""A live stack's parts: daphne and Celery worker processes on this run's database and
Redis, their environment, and ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from django.conf import settings

from tests.support.factories import AgentFixture, unique
from tests.support.mcp_requests import initialize
from tests.support.paths import ROOT

# How long the live stack's daphne may take to listen, and then its Celery worker to say
# "ready.": a cold start on a loaded 2-core host is slow (a daphne beside two other test
# runs took over 30 s to import; an embedded run's worker at load 13 took past 120 s).
LIVE_START_SECONDS = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def nobody_listening() -> Iterator[str]:
    """The URL of a loopback port that refuses every connection for as long as the block
    runs: the port is held bound, never listened on. (A port free_port found free can be
    handed to another test's server while a slow client is still starting; then "Harness is
    down" meets someone else's server.)"""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@dataclass
class LiveStack:
    url: str
    env: dict[str, str]
    worker: subprocess.Popen[bytes]
    log_dir: Path

    def client(self, fixture: AgentFixture, timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=fixture.headers, timeout=timeout)

    def mcp_session(self, fixture: AgentFixture, client: str) -> str:
        """A new MCP session of the agent on /mcp/ (an `initialize` of a new run): its id."""
        response = httpx.post(
            self.url + "/mcp/",
            json=initialize(client, run=unique("run")),
            headers={**fixture.headers, "Accept": "application/json, text/event-stream"},
        )
        return response.headers["mcp-session-id"]

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


def wait_for_port(
    port: int, proc: subprocess.Popen[bytes], log: Path, seconds: float = LIVE_START_SECONDS
) -> None:
    """Until `proc` listens on `port` (a cold start on a loaded 2-core machine is slow: a
    daphne beside two other test runs took over 30 s to import)."""
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
    deadline = time.monotonic() + LIVE_START_SECONDS  # (a cold start on a loaded host is slow)
    try:
        while "ready." not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Celery worker did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
    except BaseException:  # (pytest-timeout's too: a worker never handed back is stopped here)
        stop(proc)
        raise
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


@contextmanager
def daphne(
    env: dict[str, str], port: int, log: Path, options: tuple[str, ...] = ()
) -> Iterator[str]:
    """A daphne of its own on `port` with `env` and daphne's `options` (its output in
    `log`): its base URL while it runs, stopped after."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", *options, "-b", "127.0.0.1", "-p", str(port)]
        + ["harness_site.asgi:application"],
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
