"""The workspace's git metadata that makes git run programs, read-only for a command no
person approved (docs/security.md, "Git metadata in the sandbox").

The command reader refuses a command that names a write into a git directory, but it
cannot see a symbolic link the same command makes, or an earlier call of the same message
(every call of a message is decided before any runs): `cp -r tpl out && sed -i ...
out/meta/config`, with `tpl/meta -> ../.git`, wrote `core.fsmonitor`, and the next `git
status` (another allowed call, or a person's on the host) ran it. So for a command no
person approved, `guard` binds over the workspace's git directory, read-only, what makes
git run code: `config` (fsmonitor, filters, hooksPath, aliases), `config.worktree`,
`commondir` (another directory's config), `hooks/` and `info/` (attributes). The same for
the git directories of its submodules (`.git/modules/...`) and linked worktrees
(`.git/worktrees/...`). Objects, refs, the index and HEAD stay writable: `git add`,
`commit`, `checkout -b`, `stash` work.

Every bind is by the descriptor of what was judged (opened one name at a time with no
symlink followed, under the workspace's own descriptor), never by a path. Each directory
from `.git` down to a guarded one is bound onto itself as well: a mount point cannot be
renamed or replaced inside the sandbox, so the program cannot move the guarded directory
aside and make another in its place (and bwrap checks that what lies at each target after
mounting is the descriptor's file). A name that did not exist (`commondir` of a main
repository, a missing `hooks/`) cannot be bound; what the command made there is removed
after it, before anything else runs in the workspace (the caller holds its lock).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import stat
from pathlib import Path

from dispatcher.tools.base import ToolError

# What of the workspace's git metadata the sandbox keeps read-only (sandbox.run's `git`,
# ExecutionContext.git_guard).
ALL = "all"  # all of it: a command no person approved
ALL_BUT_CONFIG = "all-but-config"  # `git config KEY VALUE` alone, of a key that runs nothing
NONE = "none"  # none: a command a reviewer approved (they saw it)
MODES = (ALL, ALL_BUT_CONFIG, NONE)

FILES = ("config", "config.worktree", "commondir")
DIRECTORIES = ("hooks", "info")
MAX_DIRECTORIES = 128  # bound onto themselves; beyond, no unapproved command runs
MAX_DEPTH = 8
# A git directory's own directories, never another git directory's (not descended into)
GIT_OWN = frozenset({*DIRECTORIES, "objects", "refs", "logs", "branches", "rr-cache", "lfs"})
_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
# A failed write of a command the guard bound shows one of these (a file written in place,
# a file replaced by rename, a hook added).
SIGNS = ("Read-only file system", "Device or resource busy")
NOTE = (
    "\n[harness: this command ran without a person's approval, so the workspace's git "
    "metadata that makes git run programs (.git/config, .git/hooks, .git/info, "
    ".git/commondir, and those of submodules) was read-only; a write to it fails. A "
    "command a reviewer approves may change it; an allowed `git config KEY VALUE` of a "
    "key that runs nothing may set that key when it runs alone.]"
)
REMOVED = (
    "\n[harness: this command ran without a person's approval and made {names} in the "
    "workspace's git directory, which would make git run programs; it was removed. A "
    "command a reviewer approves may make it.]"
)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One bind: the descriptor held (numbered 10 or above), its path in the sandbox."""

    fd: int
    target: Path
    writable: bool


@dataclasses.dataclass
class Guard:
    """The binds of one run and the files to remove after it (`held` descriptors of git
    directories, and the names in each that did not exist)."""

    entries: list[Entry] = dataclasses.field(default_factory=list)
    absent: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    fds: list[int] = dataclasses.field(default_factory=list)

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


def guard(workspace: Path, workspace_fd: int, mode: str) -> Guard:
    """The binds that keep `workspace`'s git metadata (see the module docstring) as it is,
    for sandbox.run's `git` mode; nothing for NONE or a workspace with no `.git`.
    The caller closes the result. Raises ToolError (nothing ran) when `.git` or a guarded name
    is a symbolic link (it cannot be bound over), ValueError for an unknown mode."""
    if mode not in MODES:
        raise ValueError(f"unknown git guard mode {mode!r}")
    result = Guard()
    if mode == NONE:
        return result
    try:
        git = _open(".git", workspace_fd, result)
        if git is None:
            return result
        info = os.fstat(git)
        if stat.S_ISLNK(info.st_mode):
            raise _link(".git")
        if stat.S_ISREG(info.st_mode):  # `gitdir: PATH`: which git directory git uses
            result.entries.append(Entry(git, workspace / ".git", writable=False))
        elif stat.S_ISDIR(info.st_mode):
            _guard_directory(git, workspace / ".git", mode, result, 0)
    except BaseException:
        result.close()
        raise
    return result


def _guard_directory(fd: int, target: Path, mode: str, result: Guard, depth: int) -> None:
    """Bind the directory `fd` (at `target`) onto itself and its guarded entries over it;
    then, for the workspace's git directory, those in `modules/` and `worktrees/`, and
    for one of them, every directory it holds but git's own (`objects/`, `refs/` ...). A
    directory under `modules/` is guarded whether it holds HEAD or not: one command may
    remove HEAD so that the next finds no git directory there, and a third put it back;
    it may be a part of a submodule's name, too (`modules/a` of `a/b`)."""
    if sum(1 for entry in result.entries if entry.writable) >= MAX_DIRECTORIES:
        raise ToolError(
            f"The workspace's git directory holds more than {MAX_DIRECTORIES} directories "
            "of submodules and worktrees, so their configuration cannot be kept read-only "
            "for a command no person approved, and nothing ran. A reviewer must approve "
            "this command."
        )
    result.entries.append(Entry(fd, target, writable=True))
    for name in (*FILES, *DIRECTORIES):
        if name == "config" and mode == ALL_BUT_CONFIG:
            continue
        entry = _open(name, fd, result)
        if entry is None:
            result.absent.append((fd, name))
        elif stat.S_ISLNK(os.fstat(entry).st_mode):
            raise _link(str(Path(target.name, name)))
        else:
            result.entries.append(Entry(entry, target / name, writable=False))
    if depth >= MAX_DEPTH:
        return
    names = ["modules", "worktrees"] if depth == 0 else sorted(_names(fd))
    for name in names:
        if name in GIT_OWN:
            continue
        child = _open(name, fd, result)
        if child is not None and stat.S_ISDIR(os.fstat(child).st_mode):
            _guard_directory(child, target / name, mode, result, depth + 1)


def guarded_path(path: str) -> bool:
    """Whether `path` (relative to the workspace, `/`-separated) is git metadata `guard`
    keeps read-only: a guarded name in the workspace's git directory, or in one under its
    `modules/` or `worktrees/`, or what lies beneath one (never a name inside `objects/`,
    `refs/` ...). What an effect rule may not allow (effect_rules; `.git` itself is
    a mount point the program cannot replace, and an effect rule no file `.git`)."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if parts[:1] != [".git"]:
        return False
    for part in parts[1:]:
        if part in FILES or part in DIRECTORIES:
            return True
        if part in GIT_OWN:
            break
    return False


def _open(name: str, dir_fd: int, result: Guard) -> int | None:
    """An O_PATH descriptor (10 or above, held by `result`) of `name` in `dir_fd`, never
    followed if a symlink; None when nothing has that name."""
    try:
        fd = os.open(name, _PATH, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        held = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    finally:
        os.close(fd)
    result.fds.append(held)
    return held


def _link(name: str) -> ToolError:
    return ToolError(
        f"The workspace's git metadata holds {name!r}, a symbolic link, which cannot be "
        "kept read-only for a command no person approved, so nothing ran. A reviewer must "
        "approve this command (or replace the link with what it points to)."
    )


def _names(dir_fd: int) -> list[str]:
    opened = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return os.listdir(opened)
    finally:
        os.close(opened)


def settle(result: Guard, output: str) -> str:
    """After the run: remove what the command made where a guarded file did not exist
    (a file or a directory, not followed), and say so; add NOTE when the output shows a
    write that failed. Returns the output the model reads."""
    removed: list[str] = []
    for dir_fd, name in result.absent:
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            if stat.S_ISDIR(info.st_mode):
                _remove_tree(dir_fd, name)
            else:
                os.unlink(name, dir_fd=dir_fd)
        except OSError as error:
            raise ToolError(
                f"The command ran without a person's approval and made '{name}' in the "
                f"workspace's git directory, which would make git run programs, and it "
                f"could not be removed ({error.strerror}). Do not run git in this "
                "workspace; an operator must remove it."
            ) from None
        removed.append(name)
    if removed:
        names = ", ".join(f"'{name}'" for name in sorted(set(removed)))
        output += REMOVED.format(names=names)
    if result.entries and any(sign in output for sign in SIGNS):
        output += NOTE
    return output


def _remove_tree(dir_fd: int, name: str) -> None:
    """Remove the directory `name` in `dir_fd` and all it holds, never following a
    symlink; a directory the program made unreadable (mode 000) is made the owner's
    again first (through its O_PATH descriptor, not its name)."""
    readable = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        try:
            shutil.rmtree(name, dir_fd=readable)
        except PermissionError:
            _open_up(readable, name, depth=0)
            shutil.rmtree(name, dir_fd=readable)
    finally:
        os.close(readable)


def _open_up(dir_fd: int, name: str, depth: int) -> None:
    fd = os.open(name, _PATH, dir_fd=dir_fd)
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode) or depth > 64:
            return
        os.chmod(f"/proc/self/fd/{fd}", 0o700)
        inner = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
        try:
            for child in os.listdir(inner):
                _open_up(inner, child, depth + 1)
        finally:
            os.close(inner)
    finally:
        os.close(fd)
