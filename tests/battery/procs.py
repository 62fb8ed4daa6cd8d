"""Processes the battery starts, breaks and restarts: Redis, daphne, Celery workers and beat.

Every process runs in its own process group (a worker's pool children with it), so
`stop` ends all of it; a ProcessGroup stops everything it started (the servers together,
then their Redis) when its fixture is finalized, also after a failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from tests.support.live import free_port, live_env
from tests.support.paths import ROOT

REDIS_SERVER = "/usr/bin/redis-server"


def wait_until(
    predicate: Callable[[], object], seconds: float, what: str, step: float = 0.05
) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:g} s waiting for {what}")
        time.sleep(step)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.popen = subprocess.Popen(
            argv,
            env=env,
            cwd=ROOT,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def children(self) -> list[int]:
        try:
            return [c.pid for c in psutil.Process(self.pid).children(recursive=True)]
        except psutil.Error:
            return []

    def rss(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def kill9(self) -> None:
        """SIGKILL the process and everything in its group (a worker and its pool)."""
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)

    def stop(self, grace: float = 10) -> None:
        stop_together([self], grace)


def stop_together(procs: list[Proc], grace: float = 10) -> None:
    """SIGTERM every group, then wait for all of them within one `grace` (their shutdowns
    overlap); then SIGKILL whatever is left of each group (a pool child orphaned by a
    kill -9 of its parent)."""
    running = [proc for proc in procs if proc.alive()]
    for proc in running:
        proc.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        proc.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(10)


class ProcessGroup:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[Proc] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        log = self.tmp / f"{name}-{time.monotonic_ns()}.log"
        proc = Proc(name, argv, env, log)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        """daphnes, workers and beat together, then the Redis they use (so that none of them
        spends its shutdown reconnecting to it)."""
        redis = [proc for proc in self.procs if proc.name.startswith("redis-")]
        stop_together([proc for proc in reversed(self.procs) if proc not in redis])
        stop_together(redis)


class RedisServer:
    """A Redis of the test's own (Debian's redis-server), on a free loopback port."""

    def __init__(self, group: ProcessGroup, appendonly: bool = False) -> None:
        self.group, self.port, self.appendonly = group, free_port(), appendonly
        self.dir = group.tmp / f"redis-{self.port}"
        self.dir.mkdir(exist_ok=True)
        self.proc: Proc | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += [
            "--dir",
            str(self.dir),
            "--maxmemory-policy",
            "noeviction",
            "--protected-mode",
            "no",
        ]
        argv += ["--appendonly", "yes" if self.appendonly else "no", "--appendfsync", "everysec"]
        self.proc = self.group.start(f"redis-{self.port}", argv, dict(os.environ))
        wait_until(lambda: port_open(self.port), 10, f"redis on {self.port}")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill9()
        wait_until(lambda: not port_open(self.port), 10, "redis to go away")


class Stack:
    """daphne processes, Celery workers and a beat on this run's test database and a
    private Redis, with their own queue, channel prefix and wake-up prefix."""

    def __init__(self, group: ProcessGroup, redis: RedisServer, **env: str) -> None:
        self.group, self.redis = group, redis
        tag = uuid.uuid4().hex[:8]
        self.env = live_env(group.tmp)
        self.env.update(
            REDIS_URL=redis.url,
            HARNESS_CELERY_QUEUE=f"battery-{tag}",
            HARNESS_CELERY_BACKGROUND_QUEUE=f"battery-{tag}-background",
            HARNESS_CHANNEL_PREFIX=f"battery-{tag}",
            HARNESS_WAKE_PREFIX=f"battery:{tag}:wake",
            HARNESS_RECONCILE_INTERVAL="1",
            HARNESS_REQUEUE_AFTER="3",
            HARNESS_LOG_LEVEL="WARNING",
            # The rows load one agent far past the per-agent caps on purpose (B1's sessions,
            # B7's asks, every row's request rate); D9, the row about the caps, sets its own.
            HARNESS_MAX_SESSIONS_PER_MINUTE="0",
            HARNESS_MAX_PENDING_ASKS_PER_AGENT="0",
            HARNESS_AGENT_REQUESTS_PER_SECOND="0",
        )
        self.env.update(env)
        self.daphnes: list[tuple[Proc, str]] = []
        self.workers: list[Proc] = []

    def daphne(self) -> str:
        port = free_port()
        argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
        proc = self.group.start(
            f"daphne-{port}", [*argv, "harness_site.asgi:application"], self.env
        )
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            if not proc.alive():
                raise RuntimeError(f"daphne exited early:\n{proc.tail()}")
            return port_open(port)

        wait_until(up, 30, "daphne to listen")
        self.daphnes.append((proc, url))
        return url

    def worker(self, concurrency: int = 2, queues: str = "", **env: str) -> Proc:
        """A worker on `queues` (comma-separated), by default both lanes."""
        argv = [sys.executable, "-m", "celery", "-A", "harness_site", "worker", "-P", "prefork"]
        argv += ["-c", str(concurrency), "-l", "INFO", "--without-gossip", "--without-mingle"]
        lanes = (self.env["HARNESS_CELERY_QUEUE"], self.env["HARNESS_CELERY_BACKGROUND_QUEUE"])
        argv += ["--without-heartbeat", "-Q", queues or ",".join(lanes)]
        argv += ["-n", f"w{uuid.uuid4().hex[:6]}@%h"]
        proc = self.group.start("worker", argv, {**self.env, **env})

        def ready() -> bool:
            if not proc.alive():
                raise RuntimeError(f"worker exited early:\n{proc.tail()}")
            return "ready." in proc.tail(100_000)

        wait_until(ready, 60, "the Celery worker to be ready", step=0.1)
        self.workers.append(proc)
        return proc

    def beat(self) -> Proc:
        schedule = self.group.tmp / f"beat-{uuid.uuid4().hex[:6]}"
        argv = [sys.executable, "-m", "celery", "-A", "harness_site", "beat", "-l", "WARNING"]
        return self.group.start("beat", [*argv, "-s", str(schedule)], self.env)

    def agent_client(self, url: str, headers: dict[str, str], timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=url, headers=headers, timeout=timeout)
