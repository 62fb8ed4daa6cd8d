"""A pool of threads for this process: made on first use, and made again in a forked
child (a Celery pool process, a test's fork), whose copy of the parent's pool has no
threads left to run anything."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor


class ProcessThreads:
    """`ProcessThreads(size, prefix)()`: this process's pool of `size` threads."""

    def __init__(self, size: int, prefix: str) -> None:
        self.size, self.prefix = size, prefix
        self._pool: tuple[int, ThreadPoolExecutor] | None = None
        self._lock = threading.Lock()

    def __call__(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None or self._pool[0] != os.getpid():  # new, or a forked child
                self._pool = (os.getpid(), ThreadPoolExecutor(self.size, self.prefix))
            return self._pool[1]
