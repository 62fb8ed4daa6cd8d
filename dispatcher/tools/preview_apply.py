"""Applying a previewed effect to the workspace, or refusing because the world changed
(docs/security.md, "Previews"). The caller holds the workspace lock (workspace_lock).

`check(effect, workspace)` says why the effect may no longer be applied (None: it may):
the workspace's fingerprint differs from the preview's, a changed path's content hash
differs, or the kept upper layer is not the one previewed. `apply(effect, workspace)`
then writes exactly the upper layer: files (content, mode, mtime), directories (mode),
symlinks, hard links, and removes what the preview removed. Both work from one
descriptor of the workspace (`held`), opened as a preview opens it and held from the
check to the end of the apply, never from its path again: a workspace nested in another
agent's, whose program swaps a directory on its path for a symlink meanwhile, gets the
effect or nothing, and no other directory is read or written. Every path below it is
reached through descriptors with no symlink followed (`_confined.open_below`), so a
workspace changed under the apply can make it fail, never write outside.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dispatcher.tools import _confined, sandbox
from dispatcher.tools.base import ToolError
from dispatcher.tools.preview import (
    Effect,
    _file_sha256,
    _is_opaque,
    _is_whiteout,
    fingerprint_of,
    member_path,
)


class NotAppliable(Exception):
    """The effect may not be applied; the message says why (for the audit and the model)."""


@contextlib.contextmanager
def held(workspace: Path) -> Iterator[int]:
    """A descriptor (O_PATH) of the directory `workspace` names, opened once as a preview
    opens it (sandbox.open_unredirected: no symlink a program may have placed is
    followed), for `check` and `apply`. Raises NotAppliable when such a symlink stands on
    its path now: a program of the workspace it is nested in may have pointed it elsewhere."""
    try:
        sandbox.refuse_redirected(workspace)
        fd = sandbox.open_unredirected(Path(os.path.abspath(workspace)))
    except ToolError as error:
        raise NotAppliable(
            "the workspace's path changed since the preview (a symlink a sandboxed program "
            f"may have placed stands on it now: {error})"
        ) from None
    try:
        yield fd
    finally:
        os.close(fd)


def check(effect: Effect, workspace: Path, *, root_fd: int | None = None) -> str | None:
    """Why `effect` may not be applied to `workspace` now, or None. `root_fd`: the
    workspace as `held` opened it (else it is opened here, for this check alone)."""
    if not effect.appliable:
        return effect.why_not_appliable()
    if root_fd is None:
        try:
            with held(workspace) as fd:
                return check(effect, workspace, root_fd=fd)
        except NotAppliable as error:
            return str(error)
    tar_path = Path(effect.store) / "upper.tar"
    try:
        if _file_sha256(tar_path) != effect.upper_sha256:
            return "the kept upper layer is not the one previewed"
    except OSError:
        return "the kept upper layer is gone"
    # as run_preview took it: from the held directory, named by its path for the hidden
    # directories the walk leaves out
    named = Path(os.readlink(f"/proc/self/fd/{root_fd}"))
    if fingerprint_of(named, root_fd=root_fd) != effect.fingerprint:
        return "the workspace changed since the preview"
    for change in effect.changes:
        before = change.get("sha256_before")
        if before and _sha256_of(root_fd, change["path"]) != before:
            return f"{change['path']} changed since the preview"
    return None


def _sha256_of(root_fd: int, rel: str) -> str | None:
    try:
        fd = _confined.open_below(root_fd, rel, _confined.READ)
    except OSError:
        return None
    try:
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
        return digest.hexdigest()
    except OSError:
        return None
    finally:
        os.close(fd)


def apply(
    effect: Effect, workspace: Path, *, checked: bool = False, root_fd: int | None = None
) -> None:
    """Write the previewed upper layer over `workspace` (`root_fd`: as `held` opened it,
    else it is opened here). Raises NotAppliable (see check) unless `checked` (the caller
    ran `check` with the same `root_fd` under the same hold of the lock), and OSError when
    the workspace changes under it."""
    if root_fd is None:
        with held(workspace) as fd:
            return apply(effect, workspace, checked=checked, root_fd=fd)
    reason = None if checked else check(effect, workspace, root_fd=root_fd)
    if reason is not None:
        raise NotAppliable(reason)
    modes: list[tuple[str, int]] = []
    with tarfile.open(Path(effect.store) / "upper.tar") as tar:
        for member in tar.getmembers():
            rel = member_path(member)
            if rel:
                _apply_member(tar, member, rel, root_fd, modes)
            else:
                modes.append(("", member.mode))
    for rel, mode in reversed(modes):  # deepest first: a read-only directory last
        with _confined.directory_below(root_fd, rel) as fd:
            os.fchmod(fd, mode)
    return None


def _apply_member(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    rel: str,
    root_fd: int,
    modes: list[tuple[str, int]],
) -> None:
    parent, name = os.path.split(rel)
    with _confined.directory_below(root_fd, parent) as dir_fd:
        existing = _lstat(name, dir_fd)
        if _is_whiteout(member):
            _remove(name, dir_fd, existing)
        elif member.isdir():
            if existing is not None and (not stat.S_ISDIR(existing.st_mode) or _is_opaque(member)):
                _remove(name, dir_fd, existing)
                existing = None
            if existing is None:
                os.mkdir(name, 0o700, dir_fd=dir_fd)
                _hand_over(name, dir_fd)
            modes.append((rel, member.mode))
        elif member.issym():
            _remove(name, dir_fd, existing)
            os.symlink(member.linkname, name, dir_fd=dir_fd)
            if os.geteuid() == 0 and (owner := sandbox._owner()) is not None:
                os.chown(name, *owner, dir_fd=dir_fd, follow_symlinks=False)
        elif member.islnk():
            _remove(name, dir_fd, existing)
            source_parent, source_name = os.path.split(member_path(tar.getmember(member.linkname)))
            with _confined.directory_below(root_fd, source_parent) as source_fd:
                os.link(
                    source_name,
                    name,
                    src_dir_fd=source_fd,
                    dst_dir_fd=dir_fd,
                    follow_symlinks=False,
                )
        elif member.isfile():
            _write_file(tar, member, name, dir_fd, existing)


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _remove(name: str, dir_fd: int, existing: os.stat_result | None) -> None:
    if existing is None:
        return
    if stat.S_ISDIR(existing.st_mode):
        _remove_tree(name, dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _remove_tree(name: str, dir_fd: int) -> None:
    """Remove the directory `name` of `dir_fd` and all it holds, through descriptors, never
    following a symlink. shutil.rmtree recurses once per level (a tree 1,200 deep raised
    RecursionError after the call was claimed, the workspace half-applied): this holds
    one descriptor, goes down into each subdirectory in turn and back up through `..`,
    checked to be the directory it came from."""
    fd = os.open(name, _DIRECTORY, dir_fd=dir_fd)
    # Per level above `fd`: the parent's (st_dev, st_ino), its subdirectories still to
    # remove, and the name of the one `fd` is.
    levels: list[tuple[int, int, list[str], str]] = []
    try:
        left = _clear(fd)
        while True:
            if left:
                child = left.pop()
                here = os.fstat(fd)
                below = os.open(child, _DIRECTORY, dir_fd=fd)
                levels.append((here.st_dev, here.st_ino, left, child))
                os.close(fd)
                fd = below
                left = _clear(fd)
                continue
            if not levels:
                break
            parent = os.open("..", _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = parent
            device, inode, left, child = levels.pop()
            found = os.fstat(fd)
            if (found.st_dev, found.st_ino) != (device, inode):
                raise OSError(errno.ESTALE, "a directory moved while it was removed", child)
            os.rmdir(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def _clear(fd: int) -> list[str]:
    """Unlink everything in the directory `fd` but its subdirectories; their names."""
    with os.scandir(fd) as scan:
        entries = list(scan)
    subdirectories = []
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            subdirectories.append(entry.name)
        else:
            os.unlink(entry.name, dir_fd=fd)
    return subdirectories


def _hand_over(name: str, dir_fd: int) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        sandbox.hand_over(fd)
    finally:
        os.close(fd)


def _write_file(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    name: str,
    dir_fd: int,
    existing: os.stat_result | None,
) -> None:
    """The file's bytes written beside it, then renamed over it (atomic per file)."""
    if existing is not None and stat.S_ISDIR(existing.st_mode):
        _remove(name, dir_fd, existing)
    # A new name of fixed length, made with O_EXCL: never a file already there (a hard
    # link to another path would be written through), never longer than NAME_MAX.
    temporary = f".harness-apply-{secrets.token_hex(8)}"
    source = tar.extractfile(member)
    data = source.read() if source is not None else b""
    fd = os.open(
        temporary,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=dir_fd,
    )
    try:
        _confined.write_all(fd, data)
        sandbox.hand_over(fd)
        # Never a set-id file (such an effect is not appliable: Effect.unappliable_change)
        os.fchmod(fd, member.mode & ~(stat.S_ISUID | stat.S_ISGID))
        os.utime(fd, ns=(int(member.mtime * 1e9), int(member.mtime * 1e9)))
        os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise
    finally:
        os.close(fd)


def result_text(effect: Effect) -> str:
    """The call's result when the effect was applied: what the previewed run printed, in
    run_command's own shape."""
    return f"exit code {effect.exit_text}\n{effect.output}"


def effect_from(stored: dict[str, Any]) -> Effect:
    """The Effect kept with a call (Effect.stored()), its digest checked."""
    fields = {k: v for k, v in stored.items() if k != "appliable"}
    effect = Effect(**fields)
    recomputed = Effect(**{**fields, "digest": ""}).digest
    if recomputed != effect.digest:
        raise NotAppliable("the stored effect does not match its digest")
    return effect
