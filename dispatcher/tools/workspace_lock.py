"""One lock per workspace on this host: what keeps a preview's world still while the
previewed effect is checked and applied (docs/security.md, "Previews").

An exclusive hold is taken by a preview, by the apply of a previewed effect and by every
call a worker runs in that workspace except those declared concurrency-safe, which share
it. A flock on a file in HARNESS_DATA_DIR/locks named by the workspace's resolved path:
released by the kernel when the holder dies, so a killed worker never leaves it held.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings


def lock_path(workspace: Path) -> Path:
    name = hashlib.sha256(str(workspace.resolve()).encode()).hexdigest()[:32]
    return Path(settings.DATA_DIR) / "locks" / f"workspace-{name}.lock"


@contextlib.contextmanager
def held(workspace: Path, *, shared: bool = False, wait: bool = True) -> Iterator[None]:
    """Hold the workspace's lock (exclusive, or `shared`) for the block; waits for it,
    or, without `wait`, raises BlockingIOError when it is held."""
    path = lock_path(workspace)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(
            fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
        )
        yield
    finally:
        os.close(fd)  # releases the lock
