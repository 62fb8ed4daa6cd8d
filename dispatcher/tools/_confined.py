"""File primitives confined to the workspace even while the workspace changes under them.

`resolve_in_workspace` checks a path and resolves its symlinks; between that check and
the I/O an agent's own program (a `run_command` of another batch) can swap a directory
of the path for a symlink to `/`. So the tools never reopen a checked path by name:
they open the *resolved* path relative to a descriptor of the workspace root with no
symlink followed at all (`openat2` with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
RESOLVE_NO_MAGICLINKS, or a walk of `O_NOFOLLOW` opens one component at a time where
`openat2` is missing), then read, write, list or unlink through that descriptor. The
root's own descriptor is opened as the sandbox opens a workspace (`_open_root`), never
by its path resolved a moment before: another agent's program may flip a directory on
the path of a workspace nested in its own.

The resolved path has no symlinks and no `..` when it was checked, so a symlink found
now means the workspace changed since the check: the open fails with ELOOP and nothing
is touched. Symlinks inside the workspace that point inside it keep working, because the
check resolved them. Errors are OSError; `changed` tells the tools which ones mean
"the path changed under us".
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from dispatcher.tools import sandbox
from dispatcher.tools.base import ToolError

# openat2(2), Linux 5.6+: the syscall number is 437 on every architecture but alpha,
# ia64 and mips, which have their own.
_SYS_OPENAT2 = 437
_OPENAT2_MACHINES = frozenset({"x86_64", "aarch64", "armv7l", "riscv64", "ppc64le", "s390x"})
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
READ = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a FIFO never blocks the worker

# errnos that mean "a symlink or `..` now stands where the check saw a plain directory"
_CHANGED = frozenset({errno.ELOOP, errno.EXDEV})


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


def _load_syscall() -> Callable[..., Any] | None:
    if not sys.platform.startswith("linux") or os.uname().machine not in _OPENAT2_MACHINES:
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_long
    syscall: Callable[..., Any] = function
    return syscall


_syscall = _load_syscall()
_openat2_works = _syscall is not None  # False once the kernel (or seccomp) said ENOSYS


def changed(error: OSError) -> bool:
    """True when `error` means the path gained a symlink (or left the root) since it was
    checked: the tools report it as a refused path, not as a missing file."""
    return error.errno in _CHANGED


def changed_message(relative: str) -> str:
    """What the model is told when `changed(error)`: nothing was done, and why."""
    return (
        f"Path {relative!r} changed while the tool was using it: a symlink now stands where "
        "the check saw a plain directory or file, and it may lead outside the session "
        "workspace. Nothing was done; check the path with list_directory and retry."
    )


def _open_root(workspace: Path) -> tuple[int, Path]:
    """A descriptor (O_PATH) of the workspace root and the path it has, opened as the
    sandbox opens a workspace (sandbox.open_unredirected: no symlink a sandboxed program
    may have placed is followed), never by a path resolved a moment before: in a
    workspace nested in another agent's, that agent's program swaps a directory on the
    path for a symlink to a person's tree, and a resolve-then-open of the path led every
    file tool there. Raises OSError: ELOOP when such a symlink stands on it (see
    `changed`), ENOENT when the workspace is not there."""
    original = Path(os.path.abspath(workspace))
    try:
        fd = sandbox.open_unredirected(original)
    except ToolError as error:
        if not os.path.isdir(original):
            missing = errno.ENOENT
            raise FileNotFoundError(missing, os.strerror(missing), str(original)) from error
        raise OSError(
            errno.ELOOP, "a symlink stands on the workspace's path", str(original)
        ) from error
    return fd, Path(os.readlink(f"/proc/self/fd/{fd}"))


def _relative_parts(root: Path, path: Path) -> tuple[str, ...]:
    """`path`'s components below `root` (the path of the root as opened). A path resolved
    through another directory (the workspace's path led elsewhere while it was resolved)
    is not below it: EXDEV, as a path outside."""
    try:
        relative = path.relative_to(root)
    except ValueError:
        raise OSError(errno.EXDEV, "path is not inside the workspace", str(path)) from None
    parts = relative.parts
    if ".." in parts:  # a resolved path has none; refuse rather than walk up
        raise OSError(errno.EXDEV, "path is not inside the workspace", str(path))
    return parts


def _openat2(dir_fd: int, relative: str, flags: int, mode: int) -> int | None:
    """The descriptor from openat2(2), or None when openat2 is unavailable."""
    global _openat2_works
    if not _openat2_works or _syscall is None:
        return None
    how = _OpenHow(flags=flags, mode=mode if flags & os.O_CREAT else 0, resolve=_RESOLVE)
    while True:
        fd = int(
            _syscall(
                ctypes.c_long(_SYS_OPENAT2),
                ctypes.c_int(dir_fd),
                ctypes.c_char_p(os.fsencode(relative)),
                ctypes.byref(how),
                ctypes.c_size_t(ctypes.sizeof(how)),
            )
        )
        if fd >= 0:
            return fd
        code = ctypes.get_errno()
        if code == errno.EINTR:
            continue
        if code in (errno.ENOSYS, errno.EPERM):  # old kernel, or a seccomp filter
            if code == errno.ENOSYS:
                _openat2_works = False
            return None
        if code == errno.EAGAIN:  # only with RESOLVE_CACHED, which is not used; be safe
            return None
        raise OSError(code, os.strerror(code), relative)


def _open_nofollow(name: str, flags: int, dir_fd: int, mode: int = 0) -> int:
    """`name` in `dir_fd` opened with `O_NOFOLLOW`; ELOOP for a symlink (with O_DIRECTORY
    the kernel says ENOTDIR instead)."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except NotADirectoryError:
        if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
        raise


def _walk_open(dir_fd: int, parts: tuple[str, ...], flags: int, mode: int) -> int:
    """The fallback: one `O_NOFOLLOW` open per component, each relative to the last."""
    current = os.dup(dir_fd)
    try:
        for name in parts[:-1]:
            following = _open_nofollow(name, DIRECTORY, current)
            os.close(current)
            current = following
        return _open_nofollow(parts[-1], flags, current, mode)
    finally:
        os.close(current)


def open_beneath(workspace: Path, path: Path, flags: int, mode: int = 0o666) -> int:
    """A new descriptor for `path` (as `resolve_in_workspace` returned it), opened
    relative to the workspace root without following any symlink.

    Raises OSError: ELOOP when a component is a symlink now (see `changed`), EXDEV when
    `path` is not below the root, and the usual ENOENT, ENOTDIR, EISDIR, EACCES...
    """
    root_fd, root = _open_root(workspace)
    try:
        return _open_parts(root_fd, _relative_parts(root, path), flags, mode)
    finally:
        os.close(root_fd)


def open_below(root_fd: int, relative: str, flags: int, mode: int = 0o666) -> int:
    """`open_beneath` from a descriptor of the root held since it was judged (an O_PATH
    one will do), never from its path: `relative` ("" for the root itself) is opened
    below it with no symlink followed. A program that swaps a directory on the root's
    own path for a symlink meanwhile (a workspace nested in another agent's) leads it
    nowhere else. Raises OSError as `open_beneath` does."""
    parts = tuple(part for part in relative.split("/") if part not in ("", "."))
    if ".." in parts:
        raise OSError(errno.EXDEV, "path is not inside the workspace", relative)
    return _open_parts(root_fd, parts, flags, mode)


def _open_parts(root_fd: int, parts: tuple[str, ...], flags: int, mode: int) -> int:
    if not parts:
        return os.open(".", flags | os.O_CLOEXEC, mode, dir_fd=root_fd)
    fd = _openat2(root_fd, "/".join(parts), flags | os.O_CLOEXEC, mode)
    if fd is not None:
        return fd
    return _walk_open(root_fd, parts, flags, mode)


@contextmanager
def opened(workspace: Path, path: Path, flags: int, mode: int = 0o666) -> Iterator[int]:
    """`open_beneath` as a context manager that closes the descriptor."""
    fd = open_beneath(workspace, path, flags, mode)
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def directory_beneath(workspace: Path, path: Path, *, create: bool = False) -> Iterator[int]:
    """A descriptor of the directory `path`, creating missing components when `create`.

    Each missing component is made with mkdir relative to its parent's descriptor and
    opened again with `O_NOFOLLOW`, so a symlink swapped in at any moment is refused.
    """
    try:
        fd = open_beneath(workspace, path, DIRECTORY)
    except FileNotFoundError:
        if not create:
            raise
        fd = _make_directories(workspace, path)
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def directory_below(root_fd: int, relative: str) -> Iterator[int]:
    """`directory_beneath` (never creating) from a held descriptor of the root, as
    `open_below`: a descriptor of the directory `relative` ("" for the root itself)."""
    fd = open_below(root_fd, relative, DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def _make_directories(workspace: Path, path: Path) -> int:
    root_fd, root = _open_root(workspace)
    try:  # (the root's own descriptor is O_PATH: one that can be read is opened below it)
        current = os.open(".", DIRECTORY, dir_fd=root_fd)
    finally:
        os.close(root_fd)
    try:
        for name in _relative_parts(root, path):
            try:
                following = _open_nofollow(name, DIRECTORY, current)
            except FileNotFoundError:
                with suppress(FileExistsError):  # made meanwhile: the open below checks it
                    os.mkdir(name, 0o777, dir_fd=current)
                following = _open_nofollow(name, DIRECTORY, current)
                sandbox.hand_over(following)  # Harness as root: programs may write in it
            os.close(current)
            current = following
    except BaseException:
        os.close(current)
        raise
    return current


def read_at_most(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes read from `fd` (fewer at end of file)."""
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1024 * 1024))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    """All of `data` written to `fd`."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
