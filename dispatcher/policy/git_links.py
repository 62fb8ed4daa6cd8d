"""Where a command reaches into a git directory by a way its words do not show.

The reader keeps an allow rule from touching git's control files by the words that name
them (`sed -i ... .git/config` is unreadable), and `rules.command_reading` keeps it from a
command run in a git directory (`cwd` `.git`, or a link to it). Two ways remain that the
words alone do not show, both checked here against the disk, and both only ever making a
command unreadable (fail closed):

- a word reaching a git directory through a symbolic link in the workspace (`meta` a link
  to `.git`: `sed -i ... meta/config` writes `.git/config`, whose `core.fsmonitor` the next
  `git status` runs). A command Harness runs is in its own workspace, on this host: every
  word (and an option's attached value) is resolved there, from the command's directory
  and from each directory a `cd` in it names;
- the directory a client's shell is in (a decide-only call: Claude Code's Bash keeps its
  directory after `cd meta`, and the hook says where it is): in a git directory by its
  text, or, when it lies in the project and exists on this host, with links followed.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from dispatcher.policy.program_facts import (
    WRITES_NO_NAMED_FILE,
    names_git_control,
    names_git_directory_file,
)
from dispatcher.policy.programs import Command
from dispatcher.tools._paths import lexical_relative

MAX_CHECKS = 4096  # resolutions for one command; past that it is unreadable
MAX_STEPS = 20_000  # components read and links followed for one command (see _Budget)
MAX_CLUSTER = 4096  # a longer `-abc` word is unreadable (see _path_candidates)
MAX_LINKS = 40  # links followed in one path, as Linux (ELOOP past it)
MAX_DIRECTORIES = 8  # directories a command's `cd`s may have led to
CHANGES_DIRECTORY = frozenset({"cd", "pushd"})


def linked_git_word(commands: Iterable[Command], workspace: Path, cwd: str) -> str | None:
    """The first word of `commands` (run in `cwd`, relative to `workspace`) that reaches a
    git directory's files with symbolic links followed (or, for a program that may write
    the files it names, a file named `HEAD`, `commondir` or `gitdir`), else None. Read
    lexically, such words are unreadable already; here they are found through links."""
    try:
        root = workspace.resolve(strict=True)
    except (OSError, RuntimeError):
        return None  # no workspace yet: nothing in it is a link
    directories = [posixpath.join(root, cwd)]
    checks = 0
    budget = _Budget(MAX_STEPS)
    for command in commands:
        base = posixpath.basename(command.argv[0].rstrip("/")) if command.argv else ""
        writer = base not in WRITES_NO_NAMED_FILE and base != "git"
        for word in command.argv:
            if len(word) > MAX_CLUSTER and word.startswith("-") and not word.startswith("--"):
                return word  # a value may start at any of its positions: too many to check
            for candidate in _path_candidates(word):
                for directory in directories:
                    checks += 1
                    path = posixpath.join(directory, candidate)
                    if checks > MAX_CHECKS or _reaches(root, path, writer, budget):
                        return word
        if base in CHANGES_DIRECTORY:
            targets = [word for word in command.argv[1:] if not word.startswith("-")]
            # the shell's `cd` takes `..` lexically (`cd l/../..`, `l` a link to `x/y/z`, is
            # the directory above, not x): each one physically and logically
            joined = [posixpath.join(d, target) for d in directories for target in targets]
            for path in (*joined, *map(posixpath.normpath, joined)):
                if path not in directories:
                    directories.append(path)
            if len(directories) > MAX_DIRECTORIES:
                return command.argv[0]
    return None


def _path_candidates(word: str) -> Iterator[str]:
    """The paths a word may name: itself, an option's value after `=` (`of=x`,
    `--output=x`), or one attached to a short option (`-ox`, `-i'bak/*'`) at any position
    of its cluster (`-vvvvvvvvvvvvvvvvvvvvtmeta/hooks`: cp's `-t` after twenty `-v`).
    Made one at a time: the checks stop at MAX_CHECKS."""
    yield word
    if value := word.partition("=")[2]:
        yield value
    if word.startswith("-") and not word.startswith("--"):
        yield from (word[index:] for index in range(2, len(word)))


def _reaches(root: Path, path: str, writer: bool, budget: _Budget) -> bool:
    """True when `path` reaches a git directory's files in the workspace `root` (for a
    `writer`, a file making a directory a git directory too), or when where it leads
    cannot be known here (see `_resolve`): then it counts as reaching (fail closed)."""
    resolved = _resolve(path, budget)
    if resolved is None:
        return True
    try:
        relative = Path(resolved).relative_to(root).as_posix()
    except ValueError:
        return False  # outside the workspace: the sandbox keeps it read-only
    return names_git_control(relative) or (writer and names_git_directory_file(relative))


class _Budget:
    """Steps (a path component read, a link followed) left for one command's words: each
    step costs one system call on a descriptor, so a command line crafted to be slow to
    resolve (thousands of `a/a/a/...` words, links to `.`) ends in an unreadable command,
    not in seconds of the web process."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def spend(self) -> bool:
        self.steps -= 1
        return self.steps >= 0


def _resolve(path: str, budget: _Budget) -> str | None:
    """The absolute `path` with symbolic links followed, as the kernel will follow them
    when the command runs; or None when that cannot be known here: a link of a process's
    directory in /proc traversed (`/proc/self/cwd/meta/config`: here the web process's own
    directory, there the command's; `/dev/fd/N/...`, `/proc/PID/root/...`), a loop or more
    links than the kernel follows, or the budget spent. Each component is read from a
    descriptor on its directory (`..` is that directory's physical parent, as for the
    kernel), so the cost of a step does not grow with the path's length; past a missing
    component the rest is read lexically (nothing there is a link yet)."""
    todo = [part for part in reversed(path.split("/")) if part not in ("", ".")]
    try:
        current = os.open("/", os.O_PATH | os.O_DIRECTORY)
    except OSError:
        return None
    parts: list[str] = []
    missing = 0  # trailing components of `parts` that do not exist
    links = 0
    try:
        while todo:
            if not budget.spend():
                return None
            part = todo.pop()
            if part == "..":
                if missing:
                    missing -= 1
                elif parts:
                    current = _step(current, "..")
                if parts:
                    parts.pop()
                continue
            if missing:
                parts.append(part)
                missing += 1
                continue
            try:
                mode = os.stat(part, dir_fd=current, follow_symlinks=False).st_mode
            except (OSError, ValueError):
                parts.append(part)
                missing = 1
                continue
            if stat.S_ISLNK(mode):
                links += 1
                if links > MAX_LINKS:
                    return None  # a loop, or more than the kernel follows: fail closed
                if parts[:1] == ["proc"] and len(parts) >= 2:
                    if todo:  # a process's link (cwd, root, fd/N) is not this process's
                        return None
                    parts.append(part)
                    continue
                target = os.readlink(part, dir_fd=current)
                if target.startswith("/"):
                    current = _step(current, "/")
                    parts = []
                todo.extend(p for p in reversed(target.split("/")) if p not in ("", "."))
                continue
            parts.append(part)
            if stat.S_ISDIR(mode):
                current = _step(current, part)
            elif todo:
                missing = 1  # a file taken as a directory: nothing below it exists
        return "/" + "/".join(parts)
    except OSError:
        return None
    finally:
        os.close(current)


def _step(current: int, name: str) -> int:
    """A descriptor on `name` (a directory, `..` or `/`) from `current`, which is closed."""
    try:
        return os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=current)
    finally:
        os.close(current)


def client_cwd_in_git_directory(cwd: str, project: Path) -> bool:
    """True when a client's shell directory `cwd` lies in a git directory: by its text
    (relative to the project when inside it, else whole), or, inside the project and
    existing on this host, with symbolic links followed. Only the client's disk knows
    for certain; what this host can see only ever adds an ask."""
    relative = lexical_relative(cwd, project)
    if names_git_control(cwd if relative is None else relative):
        return True
    if relative is None:
        return False
    try:
        root = project.resolve(strict=True)
        resolved = (root / relative).resolve(strict=True)
    except (OSError, RuntimeError):
        return False  # not on this host
    try:
        return names_git_control(resolved.relative_to(root).as_posix())
    except ValueError:
        return names_git_control(resolved.as_posix())  # a link out of the project
