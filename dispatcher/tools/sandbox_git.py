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
repository, a missing `hooks/`, `modules/`) cannot be bound; what the command made there
is removed after it, before anything else runs in the workspace (the caller holds its
lock), and so is a directory it added in `modules/`, `worktrees/` or a submodule's git
directory (a git directory no one judged, which a submodule's `.git` file may name):
also after a command that timed out or failed (`remove_made`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import re
import secrets
import stat
import subprocess
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
MAX_REMOVED = 1_000_000  # entries of what a command made, removed after it; beyond, it stays aside
ASIDE = ".harness-removed-"  # what is being removed is renamed to this first
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
    # Directories where a new git directory could appear (`modules/`, `worktrees/`, a
    # submodule's git directory): the descriptor, how its entries are named in a message
    # (`modules/`), and the names it held before the run.
    containers: list[tuple[int, str, frozenset[str]]] = dataclasses.field(default_factory=list)
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
            _refuse_git_file_inside(workspace, git)
        elif stat.S_ISDIR(info.st_mode):
            _guard_directory(git, workspace / ".git", mode, result, 0)
            _refuse_pointers_inside(workspace, result)
    except BaseException:
        result.close()
        raise
    return result


def unguardable(workspace: Path) -> str | None:
    """Why the git metadata of `workspace` cannot be kept as it is for a command no person
    approved (guard refuses: a symlinked `.git` or hook directory, a configuration that
    reads a file of the workspace ...), or None. An effect rule allows nothing there: its
    writes are Harness's own, outside the sandbox (effect_rules.decide)."""
    try:
        fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        return f"The workspace cannot be opened ({error.strerror})."
    try:
        guard(workspace, fd, ALL).close()
    except (ToolError, OSError) as error:
        return str(error)
    finally:
        os.close(fd)
    return None


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
    if depth == 0:
        names = ["modules", "worktrees"]
        for name in names:
            if _open(name, fd, result) is None:  # made by the command: removed after it
                result.absent.append((fd, name))
    else:
        # A directory the command adds here (`modules/x`, `worktrees/x`, `modules/a/b`
        # of a submodule `a/b`, a submodule's own `modules/`) is a git directory no one
        # judged: removed after it (but git's own in a git directory: `logs/` ...).
        names = sorted(_names(fd))
        label = "/".join(target.parts[len(target.parts) - depth :]) + "/"
        result.containers.append(
            (fd, label, frozenset(names) | (GIT_OWN if depth > 1 else frozenset()))
        )
    if depth >= MAX_DEPTH:
        return
    for name in names:
        if name in GIT_OWN:
            continue
        child = _open(name, fd, result)
        if child is None:
            continue
        kind = os.fstat(child).st_mode
        if stat.S_ISLNK(kind) and depth <= 1:
            # `.git/modules -> ../mods`, `modules/lib -> ../../mods/lib`: git uses the
            # directory it names, which nothing binds
            raise _link(str(Path(target.name, name)))
        if stat.S_ISDIR(kind):
            _guard_directory(child, target / name, mode, result, depth + 1)


def _refuse_git_file_inside(workspace: Path, fd: int) -> None:
    """A `.git` file naming a git directory inside the workspace: that directory is the
    repository's, and nothing of it is bound, so no unapproved command runs."""
    text = _read(fd).decode("utf-8", "replace")
    first = text.splitlines()[0] if text.strip() else ""
    target = first.removeprefix("gitdir:").strip() if first.startswith("gitdir:") else ""
    if not target or _inside(workspace, os.path.join(workspace, target)):
        raise ToolError(
            "The workspace's '.git' is a file naming a git directory inside the workspace "
            f"({target!r}), whose configuration cannot be kept read-only for a command no "
            "person approved, so nothing ran. A reviewer must approve this command."
        )


# Keys of a git configuration naming a file or directory git reads as configuration or
# runs hooks from: one inside the workspace is one an unapproved command could write.
_POINTER_KEYS = re.compile(r"include\.path|includeif\..*\.path|core\.hookspath", re.DOTALL)
_READ_LIMIT = 1 << 20


def _refuse_pointers_inside(workspace: Path, result: Guard) -> None:
    """Each configuration bound read-only (`config`, `config.worktree`, of the repository and
    its submodules and worktrees) that includes a file inside the workspace (`[include] path
    = ../shared.gitconfig`, `includeIf`) or takes hooks from a directory inside it but the
    guarded `.git/hooks` (`core.hooksPath = githooks`): the command could write that file
    or directory, and the next `git status` (or a person's commit) would run what it
    planted. Nothing runs then; a reviewer must approve the command. Read by git itself
    (`git config --file - --no-includes`), not followed."""
    hooks = os.path.normpath(workspace / ".git" / "hooks")
    for entry in result.entries:
        if entry.writable or entry.target.name not in ("config", "config.worktree"):
            continue
        for key, value in _configuration(_read(entry.fd), entry.target):
            if not _POINTER_KEYS.fullmatch(key):
                continue
            if key == "core.hookspath":
                path = os.path.join(workspace, os.path.expanduser(value))
                if os.path.normpath(path) == hooks and entry.target.parent.name == ".git":
                    continue
            else:
                path = os.path.join(entry.target.parent, os.path.expanduser(value))
            if _inside(workspace, path):
                shown = entry.target.relative_to(workspace)
                raise ToolError(
                    f"The workspace's git configuration ({shown}) sets {key} = {value!r}, "
                    "inside the workspace: a command could change what git reads or runs "
                    "there, so it cannot be kept read-only for a command no person "
                    "approved, and nothing ran. A reviewer must approve this command."
                )


def _inside(workspace: Path, path: str) -> bool:
    """Whether `path` lies in `workspace`, by its words or once its links are followed."""
    root = os.path.normpath(workspace)
    for candidate in (os.path.normpath(path), os.path.realpath(path)):
        if candidate == root or candidate.startswith(root + "/"):
            return True
    return False


def _read(fd: int) -> bytes:
    """The content of the file held by the O_PATH descriptor `fd` (at most _READ_LIMIT)."""
    opened = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(opened, _READ_LIMIT + 1)
    finally:
        os.close(opened)
    if len(data) > _READ_LIMIT:
        raise ToolError(
            "The workspace's git metadata holds a file of more than 1 MiB, which cannot be "
            "read to keep it read-only for a command no person approved, so nothing ran. A "
            "reviewer must approve this command."
        )
    return data


def _configuration(data: bytes, target: Path) -> list[tuple[str, str]]:
    """The (key, value) pairs of a git configuration file, as git reads it."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_NOSYSTEM": "1"}
    env |= {"HOME": "/nonexistent", "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C"}
    try:
        done = subprocess.run(
            ["git", "config", "--file", "-", "--no-includes", "--null", "--list"],
            input=data,
            capture_output=True,
            cwd="/",
            env=env,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        done = None
    if done is None or done.returncode != 0:
        raise ToolError(
            f"The workspace's git configuration ({target.name}) could not be read, so it "
            "cannot be kept read-only for a command no person approved, and nothing ran. "
            "A reviewer must approve this command."
        )
    pairs = []
    for item in done.stdout.decode("utf-8", "replace").split("\0"):
        if item:
            key, _, value = item.partition("\n")
            pairs.append((key.lower(), value))
    return pairs


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
    """After the run: remove what the command made where a guarded name did not exist,
    and the directories it added where a git directory could be (remove_made), and say
    so; add NOTE when the output shows a write that failed. Returns the output the model
    reads."""
    removed = remove_made(result)
    if removed:
        names = ", ".join(f"'{name}'" for name in sorted(set(removed)))
        output += REMOVED.format(names=names)
    if result.entries and any(sign in output for sign in SIGNS):
        output += NOTE
    return output


def remove_made(result: Guard) -> list[str]:
    """Remove (never following a symlink) what the command made where a guarded name did
    not exist, and each directory or link it added in a `containers` directory; the names
    removed. Also after a run that failed or timed out. Raises ToolError when one cannot
    be removed."""
    removed: list[str] = []
    for dir_fd, name in result.absent:
        if _remove(dir_fd, name, name, directories_only=False):
            removed.append(name)
    for dir_fd, label, known in result.containers:
        try:
            names = _names(dir_fd)
        except OSError:
            continue
        for name in sorted(set(names) - known):
            if _remove(dir_fd, name, label + name, directories_only=True):
                removed.append(label + name)
    return removed


def _remove(dir_fd: int, name: str, shown: str, *, directories_only: bool) -> bool:
    """Remove `name` in `dir_fd`: a directory is first renamed aside (so git no longer
    finds it there, whatever happens next), then removed. False when nothing (or, with
    `directories_only`, a regular file) has that name."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    if directories_only and stat.S_ISREG(info.st_mode):
        return False
    aside = None
    try:
        if stat.S_ISDIR(info.st_mode):
            aside = f"{ASIDE}{secrets.token_hex(8)}"
            os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            _remove_tree(dir_fd, aside)
        else:
            os.unlink(name, dir_fd=dir_fd)
    except OSError as error:
        where = f" (moved aside as '{aside}')" if aside and not _exists(dir_fd, name) else ""
        raise ToolError(
            f"The command ran without a person's approval and made '{shown}' in the "
            f"workspace's git directory, which would make git run programs, and it "
            f"could not be removed{where} ({error.strerror or error}). Do not run git in "
            "this workspace; an operator must remove it."
        ) from None
    return True


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def _remove_tree(dir_fd: int, name: str) -> None:
    """Remove the directory `name` in `dir_fd` and all it holds, never following a
    symlink, with no recursion and two directories open at most (a tree thousands of
    levels deep stopped shutil.rmtree with RecursionError): each directory that is not
    empty has its entries moved up into the top one, and is removed. A directory the
    program made unreadable (mode 000) is made the owner's first, through its O_PATH
    descriptor. Past MAX_REMOVED entries it stops (OSError)."""
    top = _open_directory(dir_fd, name)
    try:
        budget = MAX_REMOVED
        token = secrets.token_hex(8)
        while entries := os.listdir(top):
            for entry in entries:
                budget -= 1
                if budget < 0:
                    raise OSError(errno.E2BIG, f"more than {MAX_REMOVED} entries")
                info = os.stat(entry, dir_fd=top, follow_symlinks=False)
                if not stat.S_ISDIR(info.st_mode):
                    os.unlink(entry, dir_fd=top)
                    continue
                inner = _open_directory(top, entry)
                try:
                    for child in os.listdir(inner):
                        budget -= 1
                        os.rename(child, f"{token}-{budget}", src_dir_fd=inner, dst_dir_fd=top)
                finally:
                    os.close(inner)
                os.rmdir(entry, dir_fd=top)
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=dir_fd)


def _open_directory(dir_fd: int, name: str) -> int:
    """`name` in `dir_fd` opened for listing, not followed, made the owner's (0700)."""
    path = os.open(name, _PATH, dir_fd=dir_fd)
    try:
        if not stat.S_ISDIR(os.fstat(path).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", name)
        os.chmod(f"/proc/self/fd/{path}", 0o700)
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=path)
    finally:
        os.close(path)
