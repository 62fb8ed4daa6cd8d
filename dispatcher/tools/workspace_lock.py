"""One lock per workspace on this host: what keeps a preview's world still while the
previewed effect is checked and applied (docs/security.md, "Previews").

An exclusive hold is taken by a preview, by the apply of a previewed effect and by every
call a worker runs in that workspace except those declared concurrency-safe, which share
it. A flock on a file in HARNESS_DATA_DIR/locks named by the workspace's device and inode:
released by the kernel when the holder dies, so a killed worker never leaves it held.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings

from dispatcher.tools import sandbox
from dispatcher.tools.base import ToolError


def lock_path(workspace: Path) -> Path:
    """The lock file of the directory `workspace` names, by its device and inode as the
    sandbox opens it (sandbox.open_unredirected: no symlink a sandboxed program may have
    placed is followed). Its path resolved instead (before) led a workspace nested in
    another agent's, whose program flips a directory on the path, to the lock of the
    directory the symlink named (another workspace's), so its calls ran unserialized, or
    raised EINVAL. Raises OSError (ELOOP) when such a symlink stands on the path now."""
    try:
        fd = sandbox.open_unredirected(Path(os.path.abspath(workspace)))
    except ToolError as error:
        raise OSError(errno.ELOOP, str(error)) from None
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    name = hashlib.sha256(f"{info.st_dev}:{info.st_ino}".encode()).hexdigest()[:32]
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
