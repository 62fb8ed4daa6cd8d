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

import posixpath
from collections.abc import Iterable
from pathlib import Path

from dispatcher.policy.program_facts import (
    WRITES_NO_NAMED_FILE,
    names_git_control,
    names_git_directory_file,
)
from dispatcher.policy.programs import Command
from dispatcher.tools._paths import lexical_relative

MAX_CHECKS = 4096  # resolutions for one command; past that it is unreadable
MAX_DIRECTORIES = 8  # directories a command's `cd`s may have led to
ATTACHED = 16  # positions in a `-abc` cluster where an attached value may start (`-i'x/*'`)
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
    directories = [root / cwd]
    checks = 0
    for command in commands:
        base = posixpath.basename(command.argv[0].rstrip("/")) if command.argv else ""
        writer = base not in WRITES_NO_NAMED_FILE and base != "git"
        for word in command.argv:
            for candidate in _path_candidates(word):
                for directory in directories:
                    checks += 1
                    if checks > MAX_CHECKS or _reaches(root, directory / candidate, writer):
                        return word
        if base in CHANGES_DIRECTORY:
            targets = [word for word in command.argv[1:] if not word.startswith("-")]
            directories += [directory / target for directory in directories for target in targets]
            if len(directories) > MAX_DIRECTORIES:
                return command.argv[0]
    return None


def _path_candidates(word: str) -> set[str]:
    """The paths a word may name: itself, an option's value after `=` (`of=x`,
    `--output=x`), or one attached to a short option (`-ox`, `-i'bak/*'`)."""
    found = {word, word.partition("=")[2]}
    if word.startswith("-") and not word.startswith("--"):
        found.update(word[index:] for index in range(2, min(len(word), ATTACHED + 2)))
    found.discard("")
    return found


def _reaches(root: Path, path: Path, writer: bool) -> bool:
    try:
        relative = path.resolve().relative_to(root).as_posix()
    except (OSError, ValueError, RuntimeError):
        return False  # outside the workspace: the sandbox keeps it read-only
    return names_git_control(relative) or (writer and names_git_directory_file(relative))


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
