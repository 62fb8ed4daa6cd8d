"""One thread per request for its database work, reused request after request.

Django's ASGI handler gives each request a thread of its own for its synchronous work
(asgiref's ThreadSensitiveContext): a new thread when the request's first hop runs, and
another that joins it when the request ends. Python starts a thread by waiting, on the
event loop's thread, until the new thread runs; the new thread needs the GIL for that,
and under a flood the GIL is busy with the flood's requests. Every other request of the
process stood still meanwhile: 0.1-0.3 s at a time, twice per request, in battery row D9
(docs/reliability.md). Here a request borrows a thread that already runs and gives it
back when it ends: one request at a time per thread, its hops in order on it, as before.

A thread that still has work when its request ends (a hop left running by a cancelled
request) is not given back: it finishes that work and stops. Threads come back to a pool
of at most IDLE_THREADS; the pool is this process's (a forked child starts its own).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

# Idle threads kept for the next requests; past this, a thread given back stops.
IDLE_THREADS = 64


class RequestThread(ThreadPoolExecutor):
    """One worker thread, serving one request at a time; knows whether it has work."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="request")
        self._counting = threading.Lock()
        self._pending = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._counting:
            self._pending += 1
        try:
            return super().submit(self._counted, fn, *args, **kwargs)
        except BaseException:
            with self._counting:
                self._pending -= 1
            raise

    def _counted(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            # (before the future is resolved: a request that saw its last hop's result
            # sees this thread idle)
            with self._counting:
                self._pending -= 1

    @property
    def idle(self) -> bool:
        with self._counting:
            return self._pending == 0


class RequestThreads:
    """This process's idle request threads."""

    def __init__(self, keep: int = IDLE_THREADS) -> None:
        self.keep = keep
        self._idle: list[RequestThread] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def take(self) -> RequestThread:
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's threads are not here
                self._idle, self._pid = [], os.getpid()
            if self._idle:
                return self._idle.pop()
        return RequestThread()

    def give_back(self, thread: RequestThread) -> None:
        """Keep `thread` for another request if it has no work left and the pool has
        room; else let it stop once its work is done (never waited for here)."""
        if thread.idle:
            with self._lock:
                if self._pid == os.getpid() and len(self._idle) < self.keep:
                    self._idle.append(thread)
                    return
        thread.shutdown(wait=False)

    def __len__(self) -> int:
        return len(self._idle)
