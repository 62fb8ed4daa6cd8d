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

The same for every repository nested in the workspace's files (`vendor/lib/.git`, found
by a walk that enters no `.git`: MAX_WALK entries at most, at any depth; beyond, no
unapproved command runs). A `.git` that was not there before the run (the workspace
had none, and `git init` made one; `sub/.git`) is judged after it: one that holds more than
git itself makes (a configuration key outside `_MADE_KEYS`, a hook that is not a
`*.sample`, `info/` beyond `exclude`, `commondir`, a link or a `gitdir:` file) is removed.
A hooks directory of the workspace that core.hooksPath names (husky's `.husky/_`) is
bound read-only the same way (`_bind_hooks_path`; with husky's `_`, its parent). A bound
configuration that includes a file of the workspace, takes hooks from it where they
cannot be bound so, or has git run a command line that may run a program of it
(`filter.x.clean = ./clean.sh`; an absolute path outside it is no such program:
`_outside`) lets no unapproved command run; so does one git reads from outside the
workspace for a work tree in it (a linked worktree's, the repository above a fixed
workspace, an included file: `_refuse_pointers_outside`, `_with_includes`). An index the run changed that names a path git refuses
(`.git/hooks/post-commit`, `../x`: a person's `git checkout -- .` writes it) is removed,
and so is, unread, one past what is left of the run's bound on all the index git reads
(INDEX_LIMIT; with more than that before the run, no unapproved command runs). A git directory under `modules/` keeps
its own directories (`objects/` ...) unguarded only while git reads its HEAD as one's;
after the run, a git directory planted in them is removed and its HEAD, `objects/` and
`refs/` put back (`_keep_git_directories`; an `objects` or `refs` that was a symbolic
link is kept, or put back as that link). The `exec` lines a run added to a rebase todo
are made comments (`_defuse_todos`), and a merge strategy git does not have or a signing
key it recorded for a `--continue` put back (`_defuse_strategies`). A directory of the
work tree git takes for a git directory by its own names (a bare repository: HEAD with
`objects/` and `refs/`) is guarded as a `.git` is when it was there before the run
(`_guard_bare`), and loses its HEAD after it when the run made it one holding more than
`git init --bare` makes (`_defuse_bare`). A git directory hidden inside a `.git`
(`.git/objects/xx`, which a made repository's remote URL may name), and a symbolic link
the run made in a guarded git directory (git writes through `COMMIT_EDITMSG`, a reflog),
are removed after it (`_remove_hidden_repositories`). Every check after a run runs whatever one
before it raised (`remove_made`). The git configurations read for one run are bounded
(MAX_CONFIG_READS, CONFIG_READ_SECONDS; past them a made `.git` is removed unread), and a
pointer under `~/` is taken to be inside the workspace (git expands it with the HOME of
whoever runs it: `_expand_home`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import os
import pwd
import re
import secrets
import stat
import subprocess
import tempfile
import threading
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path

from dispatcher.tools.base import ToolError

# What of the workspace's git metadata the sandbox keeps read-only (sandbox.run's `git`,
# ExecutionContext.git_guard).
ALL = "all"  # all of it: a command no person approved
ALL_BUT_CONFIG = "all-but-config"  # `git config KEY VALUE` alone, of a key that runs nothing
NONE = "none"  # none: a command a reviewer approved (they saw it)
MODES = (ALL, ALL_BUT_CONFIG, NONE)

# (`gitdir` of a linked worktree's git directory names the worktree's `.git` file, which
# a person's `git worktree repair` writes: `/home/u/.git` written there had it write
# `gitdir: <workspace>/.git/worktrees/x` into their home, which so became a work tree of
# the workspace's repository, its index and HEAD the agent's to set)
FILES = ("config", "config.worktree", "commondir", "gitdir")
INDEX_FILES = ("index",)  # (and a split index's `sharedindex.*`): judged after a run
# An index (with its split index's shared parts) a run left larger than this, or than
# twice what there was before and INDEX_MARGIN, is removed unread: git reads it in time
# in proportion (4,000,000 crafted entries, 288 MB, held the worker about 25 s on the
# loaded 2-core development machine; one near the sandbox's 1 GiB file cap, up to twice
# the 120 s timeout of a listing, and its listing in memory). 64 MiB reads in a second
# or two; a repository whose index was larger already gets twice that.
# The bound is on all the index git reads after one run, together (the workspace's, nested
# repositories', submodules', and those of the `.git` entries the run made: one run made
# a thousand repositories with a link to one crafted index of 60 MiB in each), and an
# index of the workspace larger than INDEX_LIMIT before a run lets no unapproved command
# run (else each run could double it for the next). Each index read counts for at least
# INDEX_READ_MIN (a scratch repository and two listings of git's).
INDEX_LIMIT = 64 << 20
INDEX_MARGIN = 1 << 20
INDEX_READ_MIN = 256 << 10
# (`remotes/` and `branches/`: git's legacy remote files, read for a remote the
# configuration does not name: `URL: .git/objects/xx` in `.git/remotes/origin` had a
# person's `git push` run `git-receive-pack` and the hooks of a repository hidden where
# no walk looks, inside a `.git`)
DIRECTORIES = ("hooks", "info", "remotes", "branches")
MAX_DIRECTORIES = 128  # bound onto themselves; beyond, no unapproved command runs
MAX_HOOKS_DEPTH = 32  # levels of a core.hooksPath directory bound; deeper, it refuses
# git configurations read (`git config --file -`, one subprocess each) before a run, and
# again after it, and the seconds they may take in all: each `.git` a command made cost
# one or two, with no bound (a command making 10,000 repositories had the worker run
# 20,000 subprocesses, minutes in the workspace's lock, past the call's time limit, whose
# kill left the rest unjudged). Past either, what is left is treated as a configuration
# that cannot be read: before the run, nothing runs; after it, a `.git` the command made
# is removed unread (`_judge_made`).
MAX_CONFIG_READS = 256
CONFIG_READ_SECONDS = 10.0
MADE_NOTES = 10  # notes of removed `.git` entries the model reads; the rest are counted
# Entries of the workspace looked at, before an unapproved run, for the `.git` of a
# repository nested in it (beyond, no unapproved command runs), and after it, for one the
# command made (no bound: a command that made more than a bound hid the `.git` it planted;
# listing an entry costs a small part of making it). No bound on directory levels.
# (500,000 made every unapproved command in a big node_modules wait for a reviewer;
# 1,000,000 entries in 100,000 directories: about 1 s warm, 6 to 9 s cold.)
MAX_WALK = 2_000_000
MAX_WALK_AFTER: int | None = None  # (every entry there was made by the command, or seen before)
MAX_REMOVED = 1_000_000  # entries of what a command made, removed after it; beyond, it stays aside
ASIDE = ".harness-removed-"  # what is being removed is renamed to this first
# A git directory's own directories, never another git directory's (not descended into)
# (and the state of an operation under way: a rebase's `rebase-merge/`, which holds its
# autostash, removed after `git rebase --autostash` in a submodule stopped on a conflict,
# lost the person's uncommitted changes). Only in a git directory (holding HEAD): in
# `modules/` and a directory of a name's parts, `refs` or `hooks` is a submodule's.
GIT_OWN = frozenset(
    {*DIRECTORIES, "objects", "refs", "logs", "branches", "rr-cache", "lfs"}
    | {"rebase-merge", "rebase-apply", "sequencer"}
)
_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
# A failed write of a command the guard bound shows one of these (a file written in place,
# a file replaced by rename, a hook added).
SIGNS = ("Read-only file system", "Device or resource busy")
NOTE = (
    "\n[harness: this command ran without a person's approval, so the workspace's git "
    "metadata that makes git run programs (.git/config, .git/hooks, .git/info, "
    ".git/commondir, a hooks directory core.hooksPath names in the workspace, and those "
    "of submodules) was read-only; a write to it fails. A "
    "command a reviewer approves may change it; an allowed `git config KEY VALUE` of a "
    "key that runs nothing may set that key when it runs alone.]"
)
MADE = (
    "\n[harness: this command ran without a person's approval and made the git directory "
    "'{path}', which {why}: git would run programs from it, so it was removed. A plain "
    "`git init`, `add` and `commit` make none of that; a command a reviewer approves may.]"
)
MADE_MANY = (
    "\n[harness: this command ran without a person's approval and made {count} more git "
    "directories ({names}), which were removed: Harness reads at most "
    f"{MAX_CONFIG_READS} git configurations (or {CONFIG_READ_SECONDS:.0f} s of them) after "
    "such a command, and does not keep a git directory it has not checked. Make fewer "
    "repositories in one command, or have a reviewer approve it.]"
)
MADE_MORE = (
    "\n[harness: this command ran without a person's approval and made {count} more git "
    "directories ({names}) that would make git run programs, as above; they were removed.]"
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
    # The workspace (its path, a descriptor held) and the identities (device, inode) of
    # the `.git` entries in it before the run, at any depth: one found after it that is
    # not among them was made by the command, and is judged (`check_made`). None: no walk
    # (NONE).
    workspace: Path | None = None
    root: int | None = None
    known: frozenset[tuple[int, int]] | None = None
    # The directories of the workspace git takes for a git directory by their own names
    # (`HEAD` with `objects/` and `refs/`, or `commondir`: a bare repository, `git init
    # --bare x`), found before the run (guarded as a `.git` is): one found after it that
    # is not among them is judged (`_defuse_bare`).
    known_bare: frozenset[tuple[int, int]] = frozenset()
    notes: list[str] = dataclasses.field(default_factory=list)
    # The `.git` entries found before the run (paths relative to the workspace), and the
    # hooks directories of the workspace that a bound configuration's core.hooksPath
    # names, bound read-only (`_bind_hooks_path`; relative paths).
    git_paths: list[str] = dataclasses.field(default_factory=list)
    hook_dirs: list[str] = dataclasses.field(default_factory=list)
    # Each guarded git directory's `index` as it was before the run (the directory's
    # descriptor, its path, the stat of the index and its split index's shared parts or
    # None, their bytes): one the run changed is read after it (`_check_indexes`).
    indexes: list[tuple[int, Path, tuple[int, ...] | None, int]] = dataclasses.field(
        default_factory=list
    )
    # The git directories under `modules/` and `worktrees/` whose own directories
    # (`objects/`, `refs/` ...) were not guarded, being theirs: the descriptor, the path,
    # HEAD as it was (`_keep_git_directories`).
    # HEAD as it was, and the digits of an object id git reads it with (`_valid_head`),
    # and its `objects` and `refs` that were symbolic links (a person's store elsewhere):
    # the name and what it names (`_put_back_links`).
    owners: list[tuple[int, Path, bytes, int, list[tuple[str, str]]]] = dataclasses.field(
        default_factory=list
    )
    # The bytes of index git may still read after the run (`index_limit` of all the
    # guarded indexes before it): `_check_indexes` and `_judge_made` take from it.
    index_budget: int = INDEX_LIMIT
    # The git configurations read so far, and the seconds they took (MAX_CONFIG_READS,
    # CONFIG_READ_SECONDS), before the run, then again after it (`_configuration`).
    config_reads: int = 0
    config_seconds: float = 0.0
    # Each guarded git directory's rebase todo's `exec` lines before the run (None: no
    # todo): one the run added is made a comment after it (`_defuse_todos`).
    todos: list[tuple[int, Path, frozenset[str] | None]] = dataclasses.field(default_factory=list)
    # Each guarded git directory's merge strategy files before the run (STRATEGY_FILES:
    # their bytes, None for none): one the run changed to a strategy git does not have is
    # put back after it (`_defuse_strategies`).
    strategies: list[tuple[int, Path, list[bytes | None]]] = dataclasses.field(default_factory=list)
    # When the guard was made (time.time_ns()): a symbolic link in a guarded git directory
    # whose ctime is later (less LINK_MARGIN_NS) was made, moved or linked there by the run
    # (`_remove_hidden_repositories`).
    started: int = 0

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
    result.started = time.time_ns()
    try:
        root = fcntl.fcntl(workspace_fd, fcntl.F_DUPFD_CLOEXEC, 10)
        result.fds.append(root)
        result.workspace, result.root = workspace, root
        bare: list[tuple[str, tuple[int, int]]] = []
        found = _git_entries(root, MAX_WALK, before=True, bare=bare)
        result.known = frozenset(identity for _, identity, _ in found)
        result.known_bare = frozenset(identity for _, identity in bare)
        result.git_paths = [path for path, _, _ in found]
        # the workspace's own `.git` first, then the git directories of repositories
        # nested in it, then their `.git` files (which may name one of those)
        order = sorted(found, key=lambda item: (item[0] != ".git", not item[2], item[0]))
        for path, _, _ in order:
            _guard_repository(workspace, path, mode, result)
        for path, _ in bare:
            _guard_bare(workspace, path, mode, result)
        _refuse_pointers_inside(workspace, result)
        _refuse_kept_links_inside(workspace, result)
        result.index_budget = _index_budget(result)
        result.config_reads, result.config_seconds = 0, 0.0  # (afresh for after the run)
    except BaseException:
        result.close()
        raise
    return result


def _guard_repository(workspace: Path, path: str, mode: str, result: Guard) -> None:
    """Guard the `.git` at `path` (relative to the workspace): a directory as the
    workspace's own, a file (`gitdir: ...`) read-only, naming no git directory of the
    workspace that is not guarded; a symbolic link stops the run (ToolError)."""
    fd = result.root
    assert fd is not None
    for part in path.split("/"):
        opened = _open(part, fd, result)
        if opened is None:
            raise _changed(path)
        fd = opened
    info = os.fstat(fd)
    if stat.S_ISLNK(info.st_mode):
        raise _link(path)
    if stat.S_ISREG(info.st_mode):  # `gitdir: PATH`: which git directory git uses
        result.entries.append(Entry(fd, workspace / path, writable=False))
        _refuse_git_file_inside(workspace, fd, workspace / path, result)
    elif stat.S_ISDIR(info.st_mode):
        _guard_directory(fd, workspace / path, mode, result, 0)


def _guard_bare(workspace: Path, path: str, mode: str, result: Guard) -> None:
    """Guard the directory at `path` that git takes for a git directory by its own names
    (a bare repository in the work tree: a person's git run in it, or below it, uses it,
    git's default `safe.bareRepository=all`) as the workspace's `.git` is. The workspace
    itself so stops the run (ToolError): it is bound already, and a person's git in it
    may take it for its git directory."""
    if not path:
        raise ToolError(
            "The workspace itself is a git directory to git (it holds HEAD, objects/ and "
            "refs/, or commondir), whose configuration cannot be kept read-only for a "
            "command no person approved, so nothing ran. A reviewer must approve this "
            "command."
        )
    fd = result.root
    assert fd is not None
    for part in path.split("/"):
        opened = _open(part, fd, result)
        if opened is None:
            raise _changed(path)
        fd = opened
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        raise _changed(path)
    _guard_directory(fd, workspace / path, mode, result, 0)


def unguardable(workspace: Path) -> str | None:
    """Why the git metadata of `workspace` cannot be kept as it is for a command no person
    approved (guard refuses: a symlinked `.git` or hook directory, a configuration that
    reads a file of the workspace ...), or None. An effect rule allows nothing there: its
    writes are Harness's own, outside the sandbox (effect_rules.decide)."""
    hooks = hook_paths(workspace)
    if isinstance(hooks, str):
        return hooks
    if hooks:
        # bound read-only in the sandbox; an effect rule's write is Harness's own, outside it
        names = ", ".join(f"'{name}'" for name in hooks)
        return (
            f"The workspace's git configuration takes hooks from {names} in the workspace, "
            "which only a command a person approved may write."
        )
    return None


def hook_paths(workspace: Path) -> list[str] | str:
    """The paths of the workspace (relative, `/`-separated, no link on the way) that the
    sandbox keeps read-only for a command no person approved though no `.git` holds them:
    each hooks directory a configuration's `core.hooksPath` names (husky's `.husky/`) and
    each file a link in a hooks directory names (`.git/hooks/pre-commit ->
    ../../scripts/pre-commit.sh`), as `guard` binds them; or, when it would refuse (a
    hook link naming a file that does not exist, `core.hooksPath` naming a directory not
    made yet ...), why. The file tools write outside the sandbox, where its binds do not
    hold them: an allowed write_file of `.husky/pre-commit` or `scripts/pre-commit.sh`
    had the person's next commit run the agent's code."""
    try:
        fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as error:
        return f"The workspace cannot be opened ({error.strerror})."
    try:
        result = guard(workspace, fd, ALL)
        result.close()
    except (ToolError, OSError) as error:
        return str(error)
    finally:
        os.close(fd)
    return list(result.hook_dirs)


def hook_refusal(
    workspace: Path, relative: str, resolved: Path | None, *, deleting: bool = False
) -> str | None:
    """Why a file tool, which writes outside the sandbox, may not write (or, `deleting`,
    delete) `relative` for a call no person approved though no `.git` holds it: the
    message the model reads (nothing was written or deleted), or None. `resolved`: the
    path the tool acts on (a write: its links followed; a delete: its directory's, the
    last name not, the link itself is what goes), None when it cannot be resolved; the
    name given and the name resolved are both judged. Refused: a path `hook_paths` gives
    (a `core.hooksPath` directory, husky's `.husky/`, or the file a hook links to,
    `scripts/pre-commit.sh`): an allowed write_file of `.husky/pre-commit` had the
    person's next commit run the agent's code, an allowed delete_file removed their
    secret scanner. And any write in a workspace whose git metadata the sandbox cannot
    keep so (where no unapproved command runs): what it cannot keep is what a write could
    plant (the `shared.gitconfig` a `[include]` of `.git/config` names, a hook link's
    missing target); and any delete there: the hooks it cannot tell are what a delete
    removes (`core.hooksPath = .husky` in a repository with a linked worktree: an allowed
    delete_file of `.husky/pre-commit` removed the person's gate, and their next commit
    passed without it)."""
    hooks = hook_paths(workspace)
    if isinstance(hooks, str):
        if deleting:
            return (
                f"'{relative}' was not deleted: the workspace's git hooks cannot be told "
                f"apart from its other files. {hooks.strip()} A call a reviewer approves "
                "may delete it."
            )
        return (
            f"'{relative}' was not written: the workspace's git metadata cannot be kept "
            f"from making a person's git run what a write plants. {hooks.strip()} A call a "
            "reviewer approves may write it."
        )
    names = names_of(workspace, relative, resolved)
    if not any(in_hook_path(name, hooks, workspace) for name in names):
        return None
    if deleting:
        return DELETE_REFUSED.format(relative=relative)
    return (
        f"'{relative}' is a git hook of the workspace (its git configuration or a hook "
        "link takes hooks from it): written here, a person's next git command in the "
        "workspace would run what it says. Nothing was written. A call a reviewer "
        "approves may write it."
    )


# What delete_file answers for git metadata (`hook_refusal`, `guarded_path`).
DELETE_REFUSED = (
    "'{relative}' is git metadata that decides what git runs (a hook, the configuration, "
    "the index): deleted, a person's next git command in the workspace would no longer "
    "run or read it. Nothing was deleted. A call a reviewer approves may delete it."
)


def names_of(workspace: Path, relative: str, resolved: Path | None) -> tuple[str, str]:
    """`relative` as given and as `resolved` (relative to the workspace, `/`-separated);
    the name given twice when it cannot be resolved (judged all the same)."""
    named = relative.replace(os.sep, "/")
    if resolved is None:
        return named, named
    try:
        return named, resolved.relative_to(workspace.resolve()).as_posix()
    except (OSError, RuntimeError, ValueError):
        return named, named


def in_hook_path(path: str, hooks: list[str], workspace: Path | None = None) -> bool:
    """Whether `path` (relative to the workspace, `/`-separated) is one of `hooks`
    (`hook_paths`) or lies beneath one: by its names as a case-insensitive file system
    compares them (`fold`: on exFAT, vfat or a casefold directory `.GITHOOKS/pre-commit`
    is `.githooks/pre-commit`, and an unapproved write_file by that name overwrote the
    person's hook), or, given the `workspace`, by a directory on its way that is a hook
    path's (device and inode: the same directory by any other name a file system gives
    it; exfat-fuse gives each name an inode of its own, so the names are folded too)."""
    parts = [fold(part) for part in path.split("/") if part not in ("", ".")]
    if any(
        parts[: len(words)] == words
        for words in ([fold(part) for part in hook.split("/") if part] for hook in hooks)
    ):
        return True
    return workspace is not None and _beneath_by_identity(workspace, parts, hooks)


def fold(name: str) -> str:
    """`name` as a case-insensitive file system matches it: case folded, in canonical
    decomposition (ext4's and tmpfs's casefold normalize too), without the characters
    HFS+ ignores (`_HFS_IGNORED`), without trailing dots and spaces (Linux's exFAT and
    vfat drivers drop a name's trailing dots: `.git./hooks/x` is `.git/hooks/x` there;
    `.` and `..` stay), upper-cased before folding (exFAT's up-case table, as Windows
    writes it, takes dotless `ı` for `I`, which case folding keeps apart). Folding a name
    on a file system that keeps case only refuses more (`.GIT/config` there is a plain
    file an unapproved call may not write)."""
    stripped = name.rstrip(". ") or name
    decomposed = unicodedata.normalize("NFD", _HFS_IGNORED.sub("", stripped))
    return unicodedata.normalize("NFD", decomposed.upper().casefold())


def _beneath_by_identity(workspace: Path, parts: list[str], hooks: list[str]) -> bool:
    """Whether a directory or file on the way of `parts` in `workspace`, as far as it
    exists, is (device and inode) one of the `hooks` paths."""
    identities = set()
    for hook in hooks:
        with contextlib.suppress(OSError, ValueError):
            found = os.stat(workspace / hook)
            identities.add((found.st_dev, found.st_ino))
    current = Path(workspace)
    for part in parts:
        current = current / part
        try:
            found = os.stat(current)
        except (OSError, ValueError):
            return False
        if (found.st_dev, found.st_ino) in identities:
            return True
    return False


def _guard_directory(
    fd: int, target: Path, mode: str, result: Guard, depth: int, digits: int = 40
) -> None:
    """Bind the directory `fd` (at `target`) onto itself and its guarded entries over it;
    then, for the workspace's git directory, those in `modules/` and `worktrees/`, and
    for one of them, every directory it holds but git's own (`objects/`, `refs/` ...). A
    directory under `modules/` is guarded whether it holds HEAD or not: one command may
    remove HEAD so that the next finds no git directory there, and a third put it back;
    it may be a part of a submodule's name, too (`modules/a` of `a/b`). `digits`: of
    an object id in the object format of the git directories above (the longest), in
    which git reads the HEAD of a directory under it (`_valid_head`)."""
    if sum(1 for entry in result.entries if entry.writable) >= MAX_DIRECTORIES:
        raise ToolError(
            f"The workspace's git directories hold more than {MAX_DIRECTORIES} directories "
            "of submodules, worktrees and bare repositories in the work tree, so their "
            "configuration cannot be kept read-only "
            "for a command no person approved, and nothing ran. A reviewer must approve "
            "this command."
        )
    result.entries.append(Entry(fd, target, writable=True))
    result.indexes.append((fd, target, _index_state(fd), _index_bytes(fd)))
    result.todos.append((fd, target, _exec_lines(fd)))
    result.strategies.append((fd, target, [_read_state(fd, *name) for name in STRATEGY_FILES]))
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
    own = False
    # git reads the HEAD of a git directory under this one in this one's object format
    # (a submodule's own submodules', by its git): the longest of those on the way, so
    # that the guard takes none for a git directory's that git does not. With the
    # workspace's alone, 40 digits in `.git/modules/x/modules/y/HEAD` of a sha256 x in a
    # sha1 workspace left y's `objects/` unguarded, and x's git used a git directory
    # planted there.
    digits = max(digits if depth else 40, 64 if _object_format(fd) == "sha256" else 40)
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
        # a git directory's own (`modules/lib/refs`), not a submodule's (`modules/refs`
        # of a submodule named `refs`, whose config nothing bound)
        # (a git directory by git's own test, as a person's git will see it: a HEAD
        # that git reads as none made `objects/evil` one git would use: `_keep_git_...`)
        head = _valid_head(fd, digits) if depth > 1 else None
        own = head is not None
        if head is not None:
            result.owners.append((fd, target, head, digits, _own_links(fd, target, result)))
        label = "/".join(target.parts[len(target.parts) - depth :]) + "/"
        result.containers.append((fd, label, frozenset(names) | (GIT_OWN if own else frozenset())))
    # (no bound on depth but MAX_DIRECTORIES: past 8 levels, a submodule at
    # `a/b/c/d/e/f/g/h` was passed over, its config writable)
    for name in names:
        if own and name in GIT_OWN:
            continue
        child = _open(name, fd, result)
        if child is None:
            continue
        kind = os.fstat(child).st_mode
        if stat.S_ISLNK(kind):
            # `.git/modules -> ../mods`, `modules/lib -> ../../mods/lib`, `modules/a/b ->
            # ...` of a submodule `a/b`: git uses the directory it names, which nothing binds
            raise _link(str(Path(target.name, name)))
        if stat.S_ISDIR(kind):
            _guard_directory(child, target / name, mode, result, depth + 1, digits)


def _index_budget(result: Guard) -> int:
    """The bytes of index git may read after the run (`index_limit` of the guarded
    indexes' bytes together). ToolError (nothing runs) past INDEX_LIMIT: the run after
    an unapproved one that doubled it (60, 120, 240 MiB ...) read it all again for a
    `touch .git/index`."""
    before = sum(size for _, _, _, size in result.indexes)
    if before > INDEX_LIMIT:
        raise ToolError(
            f"The workspace's git index is {before >> 20} MiB (with those of its nested "
            "repositories and submodules, and split index parts), more than the "
            f"{INDEX_LIMIT >> 20} MiB Harness reads after a command no person approved, so "
            "nothing ran. A reviewer must approve this command (or a person may run "
            "`git reset` if the index is not theirs)."
        )
    return index_limit(before)


def _take_index_budget(result: Guard, size: int) -> bool:
    """Whether git may read `size` bytes more of index after the run (taken then)."""
    cost = max(size, INDEX_READ_MIN)
    if cost > result.index_budget:
        return False
    result.index_budget -= cost
    return True


def _refuse_git_file_inside(workspace: Path, fd: int, where: Path, result: Guard) -> None:
    """A `.git` file naming a git directory inside the workspace: that directory is the
    repository's, and nothing of it is bound, so no unapproved command runs. But a nested
    one (a submodule's work tree) may name a directory inside a guarded git directory
    (`gitdir: ../.git/modules/lib`): its `modules/` are guarded, and a directory made
    there is removed after the run."""
    text = _read(fd).decode("utf-8", "replace")
    first = text.splitlines()[0] if text.strip() else ""
    target = first.removeprefix("gitdir:").strip() if first.startswith("gitdir:") else ""
    path = os.path.join(where.parent, target)  # (git expands no `~` there: `sub/~/gd`)
    if where != workspace / ".git" and target and _in_guarded_modules(path, result):
        return
    if not target or _inside(workspace, path):
        shown = where.relative_to(workspace)
        raise ToolError(
            f"The workspace's '{shown}' is a file naming a git directory inside the workspace "
            f"({target!r}), whose configuration cannot be kept read-only for a command no "
            "person approved, so nothing ran. A reviewer must approve this command."
        )


def _in_guarded_modules(path: str, result: Guard) -> bool:
    """Whether `path` names a submodule's or worktree's git directory that is guarded
    (bound, `.git/modules/lib`), or one that does not exist yet where a directory the
    command makes is removed after it (in `.git/modules/`, a guarded one's `modules/`)."""
    words = os.path.normpath(path)
    if os.path.realpath(path) != words:
        return False  # through a link
    guarded = {
        str(entry.target)
        for entry in result.entries
        if entry.writable and {"modules", "worktrees"} & set(entry.target.parts)
    }
    if words in guarded:
        return True
    tops = {
        str(entry.target / name)
        for entry in result.entries
        if entry.writable and entry.target.name == ".git"
        for name in ("modules", "worktrees")
    }
    return not os.path.lexists(words) and os.path.dirname(words) in guarded | tops


# Keys of a git configuration naming a file or directory git reads as configuration or
# runs hooks from: one inside the workspace is one an unapproved command could write.
_POINTER_KEYS = re.compile(r"include\.path|includeif\..*\.path|core\.hookspath", re.DOTALL)
_READ_LIMIT = 1 << 20


# Keys whose value git runs as a program or a shell command line (or hands to one).
_COMMAND_KEYS = re.compile(
    r"core\.(fsmonitor|pager|editor|sshcommand|askpass|gitproxy|alternaterefscommand)"
    r"|sequence\.editor|diff\.external|interactive\.difffilter|web\.browser"
    r"|gpg\.program|gpg\..*\.program|gpg\.ssh\.defaultkeycommand"
    r"|credential\.helper|credential\..*\.helper|filter\..*\.(clean|smudge|process)"
    r"|diff\..*\.(textconv|command)|merge\..*\.driver|(diff|merge)tool\..*\.(cmd|path)"
    r"|(browser|man)\..*\.(cmd|path)|alias\..*|pager\..*|hook\..*\.command"
    r"|trailer\..*\.(command|cmd)|sendemail\.(.*\.)?(smtpserver|sendmailcmd|tocmd|cccmd)"
    r"|sendemail\.(.*\.)?headercmd|remote\..*\.(uploadpack|receivepack|vcs)"
    r"|submodule\..*\.update|uploadpack\.packobjectshook|instaweb\.httpd"
    # (git archive's compressors, git imap-send's tunnel, git gui's tools, git-lfs's
    # programs; a diff or merge tool's name is a file git's mergetools source: `../x`)
    r"|tar\..*\.command|imap\.tunnel|guitool\..*\.cmd|lfs\.customtransfer\..*\.path"
    r"|lfs\.extension\..*\.(clean|smudge)|(diff|merge)\.(tool|guitool)",
    re.DOTALL,
)
# What a command-valued key may hold and still run nothing of the workspace: a command
# line of plain words (no shell syntax), whose program is a bare name (found on PATH) or
# an absolute path outside the workspace, and whose arguments name no file: options,
# `%f`-like placeholders, and, for a program that does not run a file it is given (a
# shell, an interpreter, an editor ...), plain words (`git-lfs clean -- %f`).
_SAFE_CHARACTERS = re.compile(r"[A-Za-z0-9_%,:+@=./ \t-]*")
_PROGRAM = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]*")
_OPTION = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9-]*(=[A-Za-z0-9_%,:+@-]*)?|--|-")
_PLACEHOLDER = re.compile(r"%[A-Za-z0-9()]+")
_WORD = re.compile(r"[A-Za-z0-9_%,:+@-]+")
_RUNS_FILES = re.compile(
    r"(ba|da|z|k|mk|c|tc|a|fi|y|r)?sh|busybox|env|exec|eval|command|source|nice|nohup"
    r"|timeout|stdbuf|setsid|xargs|sudo|doas|su|runuser|chroot|unshare|nsenter|flock"
    r"|watch|strace|ltrace|gdb|valgrind|time|python.*|pypy.*|perl.*|ruby.*|irb|php.*"
    r"|lua.*|node.*|deno|bun|npx|npm|yarn|pnpm|tclsh.*|wish.*|expect|g?awk|mawk|nawk"
    r"|sed|g?make|cmake|ninja|java|jshell|groovy|scala|kotlin|osascript|pwsh|powershell"
    r"|rscript|r|julia|erl|escript|elixir|guile|racket|sbcl|clisp|ocaml|ghci?|runghc"
    r"|swift|dotnet|mono|vim?|nvim|view|gvim|ex|emacs.*|nano|pico|micro|kak|hx|helix"
    r"|joe|jed|mcedit|ed|ssh|scp|rsync|docker|podman|kubectl|find|parallel",
    re.IGNORECASE,
)


def _runs_workspace_program(workspace: Path, key: str, value: str) -> bool:
    """Whether `value` of the command-valued `key` may run a program of the workspace
    (fail closed: whatever is not plainly a program outside it)."""
    if key.startswith("alias.") and not value.startswith("!"):
        # git's own subcommand and its arguments (an alias setting `-c` git refuses)
        words = value.split()
        return not _SAFE_CHARACTERS.fullmatch(value) or any(
            word.startswith("--exec-path") or not (_OPTION.fullmatch(word) or _WORD.fullmatch(word))
            for word in words
        )
    if key.startswith(("alias.", "credential.", "submodule.")):
        value = value.removeprefix("!")
    if not _SAFE_CHARACTERS.fullmatch(value):
        return True  # shell syntax: quotes, `;`, `$`, `~` ...
    words = value.split()
    if not words:
        return False
    program, arguments = words[0], words[1:]
    if program.startswith("/"):
        if not _outside(workspace, program):
            return True
    elif not _PROGRAM.fullmatch(program):
        return True  # `./x.sh`, `tools/x`: a path relative to where git runs
    runs_files = bool(_RUNS_FILES.fullmatch(os.path.basename(program)))
    for word in arguments:
        if _OPTION.fullmatch(word) or _PLACEHOLDER.fullmatch(word):
            continue
        if word.startswith("/") and _outside(workspace, word):
            continue  # `ssh -i /home/u/.ssh/id_ed25519`: no file the command can write
        if runs_files or not _WORD.fullmatch(word):
            return True
    return False


def _outside(workspace: Path, path: str) -> bool:
    """Whether the absolute `path` names only what no sandboxed command can write: not
    inside the workspace by its words or once every link on the way is followed, not a
    directory holding it, not under /proc or /dev (but /dev/null: `/proc/self/cwd/x`
    is, for the person's git, a file of the workspace), not in Harness's workspace root
    (other sessions' workspaces), and no `%` (ssh and git expand `%d`, `%h` ...)."""
    if "%" in path:
        return False
    if path == "/dev/null":
        return True
    resolved = _resolve(path)
    if resolved is None:
        return False
    root = os.path.normpath(workspace)
    words = os.path.normpath(path)
    for candidate in (words, resolved):
        if _inside(workspace, candidate) or candidate == "/" or root.startswith(candidate + "/"):
            return False
    if _reaches(workspace, resolved):
        return False
    others = _workspace_root()
    return others is None or not (resolved == others or resolved.startswith(others + "/"))


def _reaches(workspace: Path, resolved: str) -> bool:
    """Whether the link-free path `resolved` reaches the workspace by another name than
    its own, or what sandboxed programs write: a directory on the way (as far as it
    exists) that is the workspace's (its device and inode: a bind mount, `/mnt/alias/x.sh`
    of a workspace mounted there too) or the sandbox user's (another agent's fixed
    workspace, a server's writable path), or the path itself a directory holding the
    workspace. A path that cannot be looked at reaches it."""
    holding: set[tuple[int, int]] = set()
    own: tuple[int, int] | None = None
    for index, directory in enumerate((Path(workspace), *Path(workspace).parents)):
        try:
            found = os.stat(directory)
        except FileNotFoundError:
            continue  # (a workspace not made yet: only its words can tell)
        except OSError:
            return True
        if index == 0:
            own = (found.st_dev, found.st_ino)
        else:
            holding.add((found.st_dev, found.st_ino))
    programs = _sandbox_uid()
    current, info = "/", None
    for part in [part for part in resolved.split("/") if part]:
        current = os.path.join(current, part)
        try:
            info = os.stat(current)
        except FileNotFoundError:
            return False  # (nothing below a name that does not exist)
        except OSError:
            return True
        if (info.st_dev, info.st_ino) == own:
            return True
        if info.st_uid == programs:
            # the sandbox user's: another agent's fixed workspace, a server's writable
            # path (given to it), which a sandboxed program may write or replace
            return True
    return info is not None and (info.st_dev, info.st_ino) in holding


def _special(path: str) -> bool:
    """Whether `path` (normalized) lies under /proc or /dev (but is not /dev/null)."""
    if path == "/dev/null":
        return False
    return any(path == top or path.startswith(top + "/") for top in ("/proc", "/dev"))


def _resolve(path: str) -> str | None:
    """`path` with each symbolic link on the way followed (as os.path.realpath), or None
    when a step lies under /proc or /dev (_special), a link cannot be read, or there are
    more than 40 links."""
    parts = [part for part in path.split("/") if part]
    current, links = "/", 0
    while parts:
        part = parts.pop(0)
        if part == ".":
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        if _special(candidate):
            return None
        try:
            target = os.readlink(candidate)
        except OSError as error:
            if error.errno not in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR):
                return None  # (a directory that cannot be searched may hide a link)
            current = candidate
            continue
        links += 1
        if links > 40:
            return None
        if target.startswith("/"):
            current = "/"
        parts = [part for part in target.split("/") if part] + parts
    return None if _special(current) else current


def _sandbox_uid() -> int | None:
    """The host uid sandboxed programs write as when it is their own (Harness is root:
    sandbox.sandbox_user), else None (they write as Harness, whose files are not theirs
    to tell apart)."""
    from dispatcher.tools.sandbox_user import sandbox_user

    with contextlib.suppress(Exception):
        user = sandbox_user()
        return user[0] if user is not None else None
    return None


def _workspace_root() -> str | None:
    """Harness's workspace root (resolved), where other sessions' programs write; None
    when Django is not configured."""
    try:
        from django.conf import settings

        root = getattr(settings, "HARNESS_WORKSPACE_ROOT", None)
    except Exception:  # (ImproperlyConfigured outside Django)
        return None
    return os.path.realpath(root) if root else None


def _refuse_pointers_inside(workspace: Path, result: Guard) -> None:
    """Each configuration bound read-only (`config`, `config.worktree`, of the repository,
    of one nested in the workspace, of their submodules and worktrees) that includes a
    file inside the workspace (`[include] path = ../shared.gitconfig`, `includeIf`), takes
    hooks from a directory inside it but the guarded `.git/hooks` (`core.hooksPath =
    githooks`) that cannot be bound read-only as well (`_bind_hooks_path`: husky's
    `.husky/_` can), or has git run a command line that may run a program of the workspace
    (`filter.x.clean = ./clean.sh`, `core.fsmonitor = sh fsmon`, `alias.t = !tools/t`:
    `_runs_workspace_program`): the command could write that file or directory, and the
    next `git status` (or a person's commit) would run what it planted. Nothing runs then;
    a reviewer must approve the command. Read by git itself (`git config --file -
    --no-includes`), not followed."""
    read: list[tuple[Entry, list[tuple[str, str]]]] = []
    for entry in result.entries:
        if entry.writable or entry.target.name not in ("config", "config.worktree"):
            continue
        pairs = _configuration(_read(entry.fd), entry.target, result)
        read.append((entry, _with_includes(workspace, pairs, entry.target.parent, result)))
    hooks: list[Entry] = []
    system = _system_hooks_path(result)
    for entry, pairs in read:
        git_dir = entry.target.parent
        settings = [pair for own, found in read if own.target.parent == git_dir for pair in found]
        if (
            system is not None
            and entry.target.name == "config"
            and not any(key == "core.hookspath" for key, _ in settings)
        ):
            # (the repository's own core.hooksPath, set, is the one git takes)
            pairs = [*pairs, ("core.hookspath", system)]
        for key, value in pairs:
            why = _config_refusal(workspace, git_dir, key, value)
            if key == "core.hookspath":
                why = _tree_elsewhere(value, settings) or why
            if why is not None and key == "core.hookspath":
                why = _bind_hooks_path(workspace, git_dir, value, settings, result, hooks)
            if why is not None:
                shown = entry.target.relative_to(workspace)
                raise ToolError(
                    f"The workspace's git configuration ({shown}) sets {key} = {value!r}, "
                    f"{why}: a command could change what git reads or runs there, so it "
                    "cannot be kept read-only for a command no person approved, and "
                    "nothing ran. A reviewer must approve this command."
                )
    _refuse_pointers_outside(workspace, result, hooks)
    _bind_linked_hooks(workspace, result, hooks)
    # before the binds of the git directories: each directory is bound before what is in it
    result.entries[:0] = hooks


MAX_LINKED_HOOKS = 64  # links in hooks directories bound by what they name; beyond, it refuses


def _bind_linked_hooks(workspace: Path, result: Guard, hooks: list[Entry]) -> None:
    """Bind read-only the file of the workspace that a symbolic link in a hooks directory
    bound read-only names (`.git/hooks/pre-commit -> ../../scripts/pre-commit.sh`, as
    many projects tell their developers to set up), as a `core.hooksPath` directory is
    bound (`_bind_hooks_path`): opened one name at a time under the workspace's
    descriptor, no link followed, each directory on the way bound onto itself. The link
    cannot change (its directory is read-only), but what it names could: an unapproved
    `cp` over `scripts/pre-commit.sh` had the person's next commit run it. ToolError
    (nothing runs) when it cannot be kept so: a link on the way, `.git` on the way (the
    git directory's own binds), a name that does not exist or is no regular file (the
    command could make one there), more than MAX_LINKED_HOOKS such links. A link naming
    a file outside the workspace (or in a directory already bound read-only) is left."""
    found = 0
    targets = {entry.target for entry in hooks}
    read_only = [entry.target for entry in [*result.entries, *hooks] if not entry.writable]
    for entry in [*result.entries, *hooks]:
        if entry.writable or not _is_directory_entry(entry):
            continue
        try:
            listing = os.open(".", _WALK_FLAGS, dir_fd=entry.fd)
        except OSError:
            continue
        try:
            names = sorted(os.listdir(listing))
            links = [(name, _link_target(listing, name)) for name in names]
        finally:
            os.close(listing)
        for name, named in links:
            if named is None:
                continue
            path = named if named.startswith("/") else f"{entry.target}/{named}"
            if _outside(workspace, path):
                continue
            shown = f"'{entry.target.relative_to(workspace)}/{name}' (a link to {named!r})"
            found += 1
            why = _linked_hook_refusal(workspace, path, read_only, result, hooks, targets)
            if found > MAX_LINKED_HOOKS:
                why = f"one of more than {MAX_LINKED_HOOKS} such links"
            if why is not None:
                raise ToolError(
                    f"The workspace's git metadata holds the hook {shown}, naming a file of "
                    f"the workspace that cannot be kept read-only ({why}): a command no "
                    "person approved could change what a person's git runs, so nothing "
                    "ran. A reviewer must approve this command."
                )


def _is_directory_entry(entry: Entry) -> bool:
    try:
        return stat.S_ISDIR(os.fstat(entry.fd).st_mode)
    except OSError:
        return False


def _linked_hook_refusal(
    workspace: Path,
    path: str,
    read_only: list[Path],
    result: Guard,
    hooks: list[Entry],
    targets: set[Path],
) -> str | None:
    """Bind the file `path` (inside the workspace) names read-only, appending to `hooks`
    (`_bind_linked_hooks`); None when bound or already read-only, else why not."""
    words = [part for part in path.split("/") if part not in ("", ".")]
    folded: list[str] = []
    for word in words:  # (lexical: each name is opened below with no link followed)
        if word == "..":
            if folded:
                folded.pop()
            continue
        folded.append(word)
    base = [part for part in str(workspace).split("/") if part]
    if folded[: len(base)] != base:
        return "it names the workspace by another path"
    parts = folded[len(base) :]
    if not parts or ".git" in [fold(part) for part in parts]:
        return "inside a git directory" if parts else "it names the workspace"
    if len(parts) > MAX_HOOKS_DEPTH:
        return f"more than {MAX_HOOKS_DEPTH} directories deep"
    here = workspace.joinpath(*parts)
    if any(here == done or done in here.parents for done in read_only):
        return None  # (in a hooks directory bound read-only whole, or bound already)
    fd = result.root
    assert fd is not None
    for index, part in enumerate(parts):
        opened = _open(part, fd, result)
        if opened is None:
            return "it does not exist"
        kind = os.fstat(opened).st_mode
        target = workspace.joinpath(*parts[: index + 1])
        if stat.S_ISLNK(kind):
            return f"through the symbolic link '{'/'.join(parts[: index + 1])}'"
        if index < len(parts) - 1:
            if not stat.S_ISDIR(kind):
                return "it does not exist"
            if target not in targets:
                hooks.append(Entry(opened, target, writable=True))
                targets.add(target)
        elif not stat.S_ISREG(kind):
            return "it is not a regular file"
        else:
            hooks.append(Entry(opened, target, writable=False))
            read_only.append(target)
            # (an effect rule's write is Harness's own, outside the sandbox: `unguardable`)
            result.hook_dirs.append("/".join(parts))
        fd = opened
    return None


def _refuse_pointers_outside(workspace: Path, result: Guard, hooks: list[Entry]) -> None:
    """The same for the configuration git reads from outside the workspace for a work
    tree in it: a `.git` file's git directory outside it (the workspace, or a directory
    in it, is a linked worktree or a submodule: `git worktree add`), and the repository
    whose work tree holds the workspace (an agent's fixed workspace `repo/frontend`).
    Nothing binds those files (the sandbox cannot write them), but a hooks directory they
    name in the workspace (husky's `.husky/_`, `frontend/.husky/_`) was bound by nothing:
    an allowed `cp` planted `pre-commit` and the person's commit ran it (rt11). It is
    bound read-only as the workspace's own would be; any other pointer into the workspace
    refuses (`_config_refusal`; a command line of the enclosing repository is judged
    relative to its work tree). A relative `core.hooksPath` of the host's system
    configuration counts as theirs when they set none (`_system_hooks_path`: a linked
    worktree's `.githooks/`, which the main repository's configuration does not name)."""
    system = _system_hooks_path(result)
    for where, git_dir, own_tree in _outside_git_dirs(workspace, result):
        group: list[tuple[Path, list[tuple[str, str]]]] = []
        for path in _outside_configuration_files(git_dir):
            data = _read_path(path)
            if data is not None:
                pairs = _configuration(data, path, result)
                pairs = _with_includes(workspace, pairs, path.parent, result)
                group.append((path, pairs))
        settings = [pair for _, pairs in group for pair in pairs]
        if system is not None and not any(key == "core.hookspath" for key, _ in settings):
            group.append((SYSTEM_CONFIG, [("core.hookspath", system)]))
        for path, pairs in group:
            for key, value in pairs:
                if key == "core.hookspath":
                    why = _tree_elsewhere(value, settings)
                    why = why or _config_refusal(workspace, where, key, value)
                    if why is not None:
                        why = _bind_hooks_path(workspace, where, value, settings, result, hooks)
                elif _COMMAND_KEYS.fullmatch(key) and not own_tree:
                    why = _enclosing_command_refusal(workspace, where.parent, value)
                elif _COMMAND_KEYS.fullmatch(key):
                    why = _config_refusal(workspace, where, key, value)
                else:
                    why = _config_refusal(workspace, path.parent, key, value)
                if why is not None:
                    raise ToolError(
                        f"The git configuration the workspace's work tree uses ({path}) sets "
                        f"{key} = {value!r}, {why}: a command could change what git reads "
                        "or runs there, so it cannot be kept read-only for a command no "
                        "person approved, and nothing ran. A reviewer must approve this "
                        "command."
                    )


def _tree_elsewhere(value: str, settings: list[tuple[str, str]]) -> str | None:
    """Why a relative `core.hooksPath = value` cannot be placed, with these settings of its
    git directory: git takes it from the work tree it runs hooks in, which core.worktree
    (or core.bare) moves from the `.git`'s parent. `core.worktree = ../sub` with
    `core.hooksPath = ../hooks` named the workspace's `hooks/`, judged outside (from the
    workspace's parent) and bound by nothing: an allowed `cp` planted `pre-commit` and
    the person's commit ran it. Then it is taken to be inside (and cannot be bound)."""
    if value.startswith("~") or os.path.isabs(value):
        return None
    for key, setting in settings:
        if key == "core.worktree" or (key == "core.bare" and setting.lower() != "false"):
            return f"relative to a work tree {key} sets elsewhere, taken to be inside the workspace"
    return None


def _with_includes(
    workspace: Path,
    pairs: list[tuple[str, str]],
    base: Path | str,
    budget: Guard,
    depth: int = 0,
) -> list[tuple[str, str]]:
    """`pairs` with, after each `include.path` or `includeIf.*.path` naming a file outside
    the workspace (`_outside`; one inside refuses in `_config_refusal`), the settings of
    that file (whatever its condition), and of what it includes in turn: git takes them
    as the configuration's own, so `core.hooksPath = githooks` in an included
    `/etc/team/git.conf` names the workspace's `githooks/` (rt11: it was bound by
    nothing)."""
    out: list[tuple[str, str]] = []
    for key, value in pairs:
        out.append((key, value))
        if key != "include.path" and not (key.startswith("includeif.") and key.endswith(".path")):
            continue
        expanded = _expand_home(value)
        if expanded is None:
            continue  # (refused: `_config_refusal`)
        path = os.path.join(base, expanded)
        if not _outside(workspace, path):
            continue
        if depth >= 10:
            raise ToolError(
                "The workspace's git configuration includes files more than 10 levels deep, "
                "so it cannot be checked for a command no person approved, and nothing "
                "ran. A reviewer must approve this command."
            )
        data = _read_path(Path(path))
        if data is not None:
            found = _configuration(data, Path(path), budget)
            out += _with_includes(workspace, found, os.path.dirname(path), budget, depth + 1)
    return out


def _outside_git_dirs(workspace: Path, result: Guard) -> list[tuple[Path, Path, bool]]:
    """(the `.git` in the work tree, the git directory it names, whether that work tree
    is the workspace's own or one in it) for each `.git` file of the workspace naming a
    git directory outside it, and for the nearest `.git` above the workspace."""
    found: list[tuple[Path, Path, bool]] = []
    for entry in result.entries:
        if entry.target.name != ".git" or entry.writable:
            continue
        if not stat.S_ISREG(os.fstat(entry.fd).st_mode):
            continue
        target = _gitdir_of(_read(entry.fd), entry.target)
        if target is not None and not _inside(workspace, str(target)):
            found.append((entry.target, target, True))
    for above in Path(workspace).parents:
        dot_git = above / ".git"
        try:
            info = os.stat(dot_git)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode):
            found.append((dot_git, dot_git, False))
        elif stat.S_ISREG(info.st_mode):
            data = _read_path(dot_git)
            target = _gitdir_of(data or b"", dot_git)
            if target is None:
                raise ToolError(
                    f"The git repository holding the workspace ({dot_git}) names no git "
                    "directory git can read, so its configuration cannot be checked for a "
                    "command no person approved, and nothing ran. A reviewer must approve "
                    "this command."
                )
            found.append((dot_git, target, False))
        break
    return found


def _gitdir_of(data: bytes, where: Path) -> Path | None:
    """The git directory a `.git` file at `where` names (`gitdir: PATH`), or None."""
    text = data.decode("utf-8", "replace")
    first = text.splitlines()[0] if text.strip() else ""
    if not first.startswith("gitdir:"):
        return None
    target = first.removeprefix("gitdir:").strip()
    return Path(os.path.normpath(os.path.join(where.parent, target))) if target else None


def _outside_configuration_files(git_dir: Path) -> list[Path]:
    """The configuration files git reads for the git directory `git_dir`: its `config`
    and `config.worktree`, and its `commondir`'s `config` (a linked worktree's)."""
    files = [git_dir / "config", git_dir / "config.worktree"]
    common = _read_path(git_dir / "commondir")
    if common is not None and common.strip():
        shared = os.path.join(git_dir, common.decode("utf-8", "replace").strip())
        files.append(Path(os.path.normpath(shared)) / "config")
    return files


# The host's system-wide git configuration, which a person's git reads in every
# repository (and the sandbox shows its programs: ETC_ENTRIES).
SYSTEM_CONFIG = Path("/etc/gitconfig")


def _system_hooks_path(result: Guard) -> str | None:
    """The `core.hooksPath` of the host's system configuration (SYSTEM_CONFIG), or None:
    relative, it names a hooks directory in every repository's work tree (git takes a
    relative one from there), one no repository's configuration shows. Judged as
    the repository's own would be (`_bind_hooks_path`): `/etc/gitconfig` setting
    `core.hooksPath = .githooks` made `.githooks/pre-commit` the hook of every repository
    of the host, which an allowed write_file (or command) planted and the person's next
    commit ran."""
    data = _read_path(SYSTEM_CONFIG)
    if data is None:
        return None
    values = [v for k, v in _configuration(data, SYSTEM_CONFIG, result) if k == "core.hookspath"]
    if not values or values[-1].startswith("~"):
        return None  # (none, or one in the home of whoever runs git: not the workspace's)
    return values[-1]


def _read_path(path: Path) -> bytes | None:
    """The content of the file at `path` outside the workspace (at most _READ_LIMIT), or
    None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ToolError(
            f"The git configuration the workspace's work tree uses ({path}) cannot be read "
            f"({error.strerror}), so nothing ran. A reviewer must approve this command."
        ) from error
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, _READ_LIMIT + 1)
    finally:
        os.close(fd)
    if len(data) > _READ_LIMIT:
        raise ToolError(
            f"The git configuration the workspace's work tree uses ({path}) is larger than "
            "1 MiB, so nothing ran. A reviewer must approve this command."
        )
    return data


def _enclosing_command_refusal(workspace: Path, tree: Path, value: str) -> str | None:
    """Why a command line of the repository whose work tree `tree` holds the workspace
    may run a file of the workspace (git runs it in `tree`): a word with `/` that is,
    taken from `tree`, not `_outside` it (`frontend/fsmon.sh`, `/proc/self/cwd/...`), or
    any shell syntax (`!cd frontend && ./t.sh`: where a word runs is the shell's)."""
    if re.search(r"[;&|$`()<>'\"\\\n{}*?\[\]~]", value.removeprefix("!")):
        return "a command line with shell syntax, which may run a program of the workspace"
    for word in value.replace("=", " ").split():
        if "/" not in word or word.startswith("-"):
            continue
        word = word.lstrip("!")
        if not _outside(workspace, os.path.join(tree, word)):
            return "a command line that may run a program of the workspace"
    return None


def _bind_hooks_path(
    workspace: Path,
    git_dir: Path,
    value: str,
    settings: list[tuple[str, str]],
    result: Guard,
    hooks: list[Entry],
) -> str | None:
    """Bind read-only the directory inside the workspace that `core.hooksPath = value` of
    the git directory `git_dir` (a `.git`, whose work tree is its parent) names, as its
    `hooks/` is: opened one name at a time under the workspace's descriptor, no link
    followed, and each directory from the workspace down to it bound onto itself (a mount
    point cannot be renamed aside and made again). When its last name is `_` (husky 9:
    `.husky/_/pre-commit` runs `.husky/pre-commit`), its parent is bound read-only
    instead, with all it holds. Appends to `hooks`; None when bound, else why it cannot
    be (then nothing runs): a directory that does not exist, a link, `..`, a work tree
    set elsewhere (`core.worktree`), a bare repository, linked worktrees (each takes a
    relative hooksPath from its own work tree), a `.git` inside it."""
    inside = "inside the workspace"
    if value.startswith("~") and _expand_home(value) is None:
        return HOME_UNKNOWN
    if git_dir.name != ".git" or value.startswith("~"):
        return inside
    for key, setting in settings:
        if key == "core.worktree" or (key == "core.bare" and setting.lower() != "false"):
            return f"{inside}, with core.{key.split('.')[1]} set"
    if any(entry.target.parent == git_dir / "worktrees" for entry in result.entries):
        return f"{inside}, with linked worktrees (each runs its own copy)"
    path = value if value.startswith("/") else f"{git_dir.parent}/{value}"
    words = [part for part in path.split("/") if part not in ("", ".")]
    base = [part for part in str(workspace).split("/") if part]
    if ".." in words or words[: len(base)] != base:
        return inside
    parts = words[len(base) :]
    bound = parts[:-1] if parts[-1:] == ["_"] else parts
    if not bound or ".git" in [fold(part) for part in parts]:
        return inside
    if len(parts) > MAX_HOOKS_DEPTH:  # (a descriptor and a mount for each)
        return f"{inside}, more than {MAX_HOOKS_DEPTH} directories deep"
    shown = "/".join(bound)
    if any(git.startswith(shown + "/") for git in result.git_paths):
        return f"{inside}, holding a repository's '.git'"
    for other in result.hook_dirs:
        if other == shown:
            return None  # (the same directory, named by another configuration)
        if other.startswith(shown + "/") or shown.startswith(other + "/"):
            return f"{inside}, nested in another hooks directory"
    targets = {entry.target for entry in hooks}
    fd = result.root
    assert fd is not None
    for index, part in enumerate(parts):
        opened = _open(part, fd, result)
        if opened is None:
            return f"{inside}, which does not exist"
        kind = os.fstat(opened).st_mode
        if stat.S_ISLNK(kind):
            return f"{inside}, through the symbolic link '{'/'.join(parts[: index + 1])}'"
        if not stat.S_ISDIR(kind):
            return f"{inside}, which is not a directory"
        target = workspace.joinpath(*parts[: index + 1])
        if index < len(bound) - 1 and target not in targets:
            hooks.append(Entry(opened, target, writable=True))
        elif index == len(bound) - 1:
            hooks.append(Entry(opened, target, writable=False))
        fd = opened
    result.hook_dirs.append(shown)
    return None


def _config_refusal(workspace: Path, git_dir: Path, key: str, value: str) -> str | None:
    """Why the setting `key = value` of the git directory `git_dir`'s configuration lets
    a command of the workspace change what git reads or runs, or None."""
    if _COMMAND_KEYS.fullmatch(key):
        if _runs_workspace_program(workspace, key, value):
            return "a command line that may run a program of the workspace"
        return None
    if key in ("protocol.allow", "protocol.ext.allow") and value.lower() != "never":
        return "which lets a remote's address run a command"
    if not _POINTER_KEYS.fullmatch(key):
        return None
    if key == "core.hookspath":
        # relative to the work tree git runs hooks in: a `.git`'s parent; a submodule's or
        # worktree's may lie anywhere in the workspace (`../githooks` from `lib/` is the
        # workspace's `githooks/`), so a relative path there is taken to be inside it
        expanded = _expand_home(value)
        if expanded is None:
            return HOME_UNKNOWN
        if git_dir.name != ".git" and not os.path.isabs(expanded):
            return "relative to a work tree inside the workspace"
        path = os.path.join(git_dir.parent, expanded)
        if git_dir.name == ".git" and os.path.normpath(path) == os.path.normpath(git_dir / "hooks"):
            return None
    else:
        expanded = _expand_home(value)
        if expanded is None:
            return HOME_UNKNOWN
        path = os.path.join(git_dir, expanded)
    # as a command's absolute path (`_outside`): `/proc/self/cwd/githooks` is, for the
    # person's git run in the work tree, the workspace's `githooks/`
    return None if _outside(workspace, path) else "inside the workspace"


HOME_UNKNOWN = (
    "under '~', the home of whoever runs git (their HOME, which Harness cannot know: it "
    "may hold the workspace), taken to be inside the workspace"
)


def _expand_home(value: str) -> str | None:
    """`value` with a leading `~user` replaced by that user's home from the password
    database, as git does (`~user/githooks`); None for `~` alone or `~/...`, which git
    takes from the HOME of whoever runs it: not Harness's (expanded with Harness's home,
    `core.hooksPath = ~/ws/githooks` was judged outside, bound by nothing, and the
    person's commit, their HOME holding `ws/`, ran the `pre-commit` an allowed `cp`
    planted), nor surely the person's own. None too for a user who does not exist (git
    then stops)."""
    if not value.startswith("~"):
        return value
    user, _, rest = value[1:].partition("/")
    if not user:
        return None
    try:
        home = pwd.getpwnam(user).pw_dir
    except (KeyError, UnicodeError, ValueError):
        return None
    return os.path.join(home, rest) if rest else home


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


class ConfigBudgetSpent(ToolError):
    """More git configurations to read than `_configuration` reads for one run (before or
    after it): what is left is treated as a configuration that cannot be read."""


# What git read of a configuration's bytes (`_configuration`), kept per process: git's
# reading is a function of the bytes alone (`--file -`, `--no-includes`, no system or
# global file, a fixed environment), and the same few files are read again at every check
# (the host's /etc/gitconfig twice per `guard`, the repository's `config`): a subprocess
# each, 3-5 ms apiece, was most of an approved write_file's way from its approval to its
# claim in the worker (docs/benchmarks.md, S5). Keyed by the bytes' SHA-256; the newest
# _PARSED_MAX readings of configurations up to _PARSED_SIZE bytes are kept, each reading
# no larger itself (its keys' and values' characters, and _PARSED_PAIR for each pair: what
# Python holds of one): git repeats a section's name in each key, and a 64 KiB file of a
# 32 KiB name and 16 K lines `a` read as 512 MiB of keys, which the worker kept (64 of
# them: 32 GiB), and whose reading again, 2.5 s of git each, became free of the run's
# CONFIG_READ_SECONDS. A reading that failed is never kept (it fails again each time).
# Each read counts in its run's budget, kept or not: what a run may read, and what it
# refuses past it, are as without the memo.
_PARSED: dict[bytes, tuple[tuple[str, str], ...]] = {}
_PARSED_MAX = 64
_PARSED_SIZE = 64 << 10
_PARSED_PAIR = 160
_PARSED_LOCK = threading.Lock()


def _configuration(data: bytes, target: Path, budget: Guard) -> list[tuple[str, str]]:
    """The (key, value) pairs of a git configuration file, as git reads it. Counted in
    `budget` (a subprocess each, or a reading of the same bytes kept: `_PARSED`):
    ConfigBudgetSpent past MAX_CONFIG_READS reads or CONFIG_READ_SECONDS, ToolError when
    git cannot read it."""
    if budget.config_reads >= MAX_CONFIG_READS or budget.config_seconds >= CONFIG_READ_SECONDS:
        raise ConfigBudgetSpent(
            f"The workspace holds more git configurations than Harness reads for a command "
            f"no person approved ({MAX_CONFIG_READS}, or {CONFIG_READ_SECONDS:.0f} s of "
            f"reading), so '{target.name}' could not be checked and nothing ran. A reviewer "
            "must approve this command."
        )
    budget.config_reads += 1
    key = hashlib.sha256(data).digest() if len(data) <= _PARSED_SIZE else None
    kept = _PARSED.get(key) if key is not None else None
    if kept is not None:
        return list(kept)
    pairs = _git_reading(data, target, budget)
    size = sum(len(name) + len(value) + _PARSED_PAIR for name, value in pairs)
    if key is not None and size <= _PARSED_SIZE:
        with _PARSED_LOCK:
            while len(_PARSED) >= _PARSED_MAX:
                del _PARSED[next(iter(_PARSED))]  # (the oldest first)
            _PARSED[key] = tuple(pairs)
    return pairs


def _git_reading(data: bytes, target: Path, budget: Guard) -> list[tuple[str, str]]:
    """`_configuration`'s reading by git itself (one subprocess, timed in `budget`)."""
    started = time.monotonic()
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
    finally:
        budget.config_seconds += time.monotonic() - started
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


class _Unchecked(Exception):
    """The workspace's tree could not be looked at whole (too many entries, a directory
    that changed or cannot be read): `.git` entries in it may be missed."""


def _git_entries(
    root: int,
    limit: int | None,
    *,
    before: bool,
    bare: list[tuple[str, tuple[int, int]]] | None = None,
    fifos: list[str] | None = None,
) -> list[tuple[str, tuple[int, int], bool]]:
    """The `.git` entries (directory, file or link) in the workspace held by `root`, at any
    depth, as (path relative to it, (device, inode)); none descended into, no link
    followed (_walk). Added to `bare`: the directories git takes for a git directory by
    their own names (`_looks_like_git_directory`); to `fifos`, each FIFO (or device) met.
    ToolError past `limit` entries, or with a directory that cannot be read."""
    try:
        return _walk(root, limit, bare if bare is not None else [], fifos=fifos)
    except (_Unchecked, OSError) as error:
        why = str(error) if isinstance(error, _Unchecked) else (error.strerror or str(error))
        if before:
            raise ToolError(
                f"The workspace cannot be searched for the git directories of repositories "
                f"nested in it ({why}), whose configuration must be kept read-only for a "
                "command no person approved, so nothing ran. A reviewer must approve this "
                "command."
            ) from None
        raise ToolError(
            "The command ran without a person's approval, and the workspace could not be "
            f"searched afterwards for a git directory it made ({why}), which could make "
            "git run programs. Do not run git in this workspace until it is checked; an "
            "operator must look for a '.git' it made."
        ) from None


_WALK_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Descriptors the walk keeps open at once, of the levels nearest the one it is in (as
# sandbox.give_to_sandbox): a level whose descriptor was closed is opened again from the
# nearest open one above it, one name at a time with no link followed, and must be the
# same directory.
OPEN_LEVELS = 64


@dataclasses.dataclass
class _Level:
    fd: int | None
    name: str  # in the level above
    prefix: str  # the path of what it holds, relative to the workspace
    identity: tuple[int, int]
    pending: list[str]  # its directories not yet walked


def _walk(
    root: int,
    limit: int | None,
    bare: list[tuple[str, tuple[int, int]]],
    links: list[str] | None = None,
    since: int = 0,
    fifos: list[str] | None = None,
) -> list[tuple[str, tuple[int, int], bool]]:
    """Depth first, at any depth (a tree 130 levels deep stopped the search after a run,
    which kept the `.git` a command planted beside it): what is kept of each level is its
    directories not yet walked, and a descriptor for the OPEN_LEVELS nearest levels."""
    found: list[tuple[str, tuple[int, int], bool]] = []
    seen = 0
    top = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root)
    levels: list[_Level] = []
    try:
        levels.append(_Level(top, "", "", _identity(top), []))
        seen = _list(levels[0], seen, limit, found, bare, links, since, fifos)
        while levels:
            level = levels[-1]
            if not level.pending:
                levels.pop()
                if level.fd is not None:
                    os.close(level.fd)
                continue
            if level.fd is None:
                _reopen(levels)
            assert level.fd is not None
            name = level.pending.pop()
            child = os.open(name, _WALK_FLAGS, dir_fd=level.fd)
            levels.append(_Level(child, name, f"{level.prefix}{name}/", _identity(child), []))
            seen = _list(levels[-1], seen, limit, found, bare, links, since, fifos)
            far = len(levels) - 1 - OPEN_LEVELS
            if far >= 1 and levels[far].fd is not None:
                os.close(levels[far].fd)  # type: ignore[arg-type]
                levels[far].fd = None
    finally:
        for level in levels:
            if level.fd is not None:
                os.close(level.fd)
    return found


def _list(
    level: _Level,
    seen: int,
    limit: int | None,
    found: list[tuple[str, tuple[int, int], bool]],
    bare: list[tuple[str, tuple[int, int]]],
    links: list[str] | None = None,
    since: int = 0,
    fifos: list[str] | None = None,
) -> int:
    """Look at the entries of `level`: a `.git` is found, a directory kept to be walked,
    a FIFO added to `fifos` (when given), and the level itself added to `bare` when git
    takes it for a git directory. The entries seen so far; _Unchecked past `limit`."""
    assert level.fd is not None
    head = False
    with os.scandir(level.fd) as listing:
        for entry in listing:
            head = head or entry.name == "HEAD"
            seen += 1
            if limit is not None and seen > limit:
                raise _Unchecked(f"more than {limit} entries")
            directory = entry.is_dir(follow_symlinks=False)
            link = entry.is_symlink()
            if entry.name == ".git":
                info = os.stat(entry.name, dir_fd=level.fd, follow_symlinks=False)
                found.append((level.prefix + entry.name, (info.st_dev, info.st_ino), directory))
            elif directory:
                level.pending.append(entry.name)
            elif links is not None and link:
                # (made, moved or linked since `since`, its ctime then; or older, unless
                # git reads it as a symbolic ref: `_old_link_kept`)
                info = os.stat(entry.name, dir_fd=level.fd, follow_symlinks=False)
                if info.st_ctime_ns >= since or not _symbolic_ref(level.fd, entry.name):
                    links.append(level.prefix + entry.name)
            elif links is not None and not entry.is_file(follow_symlinks=False):
                # (a FIFO, whenever made: git makes none, and opens what it reads or
                # writes by name waiting for one: `logs/HEAD` hung `git checkout -b`)
                info = os.stat(entry.name, dir_fd=level.fd, follow_symlinks=False)
                if _blocks(info.st_mode):
                    links.append(level.prefix + entry.name)
            elif fifos is not None and not (entry.is_file(follow_symlinks=False) or link):
                info = os.stat(entry.name, dir_fd=level.fd, follow_symlinks=False)
                if _blocks(info.st_mode):
                    fifos.append(level.prefix + entry.name)
    if head and _looks_like_git_directory(
        {name for name in _GIT_DIRECTORY_NAMES if _exists(level.fd, name)}
    ):
        bare.append((level.prefix.removesuffix("/"), level.identity))
    return seen


_GIT_DIRECTORY_NAMES = frozenset({"HEAD", "objects", "refs", "commondir"})


def _blocks(mode: int) -> bool:
    """Whether a file of this mode is one git's open of it by name waits on (a FIFO; a
    device, which a sandbox cannot make): git makes none in a git directory."""
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode)


def _looks_like_git_directory(names: set[str] | frozenset[str]) -> bool:
    """Whether a directory holding these names may be a git directory to git
    (is_git_directory: a HEAD it reads as one, and `objects/` and `refs/` it can enter, or
    theirs in the directory `commondir` names), by their names alone, whatever each is (a
    link to a directory counts: git follows it)."""
    return "HEAD" in names and ("commondir" in names or {"objects", "refs"} <= names)


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _reopen(levels: list[_Level]) -> None:
    """Open the newest level's directory again, from the nearest level still open, and
    keep the OPEN_LEVELS nearest it open. _Unchecked when one is no longer the directory
    it was."""
    base = max(i for i, level in enumerate(levels) if level.fd is not None)
    keep_from = len(levels) - OPEN_LEVELS
    current = levels[base].fd
    assert current is not None
    passing: int | None = None  # opened only to reach the next level
    try:
        for i in range(base + 1, len(levels)):
            fd = os.open(levels[i].name, _WALK_FLAGS, dir_fd=current)
            if passing is not None:
                os.close(passing)
                passing = None
            if _identity(fd) != levels[i].identity:
                os.close(fd)
                raise _Unchecked(f"'{levels[i].prefix}' changed while it was searched")
            if i >= keep_from:
                levels[i].fd = fd
            else:
                passing = fd
            current = fd
    finally:
        if passing is not None:
            os.close(passing)


def _changed(path: str) -> ToolError:
    return ToolError(
        f"The workspace's '{path}' changed while its git metadata was being guarded, so "
        "nothing ran; try again."
    )


def guarded_path(path: str) -> bool:
    """Whether `path` (relative to the workspace, `/`-separated) is git metadata `guard`
    keeps read-only, or whose content it judges after a run (the index: git reads paths
    from it that a checkout writes, unchecked): a guarded name in the workspace's git
    directory or a nested
    repository's (`sub/.git/config`), or in one under its `modules/` or `worktrees/`, or
    what lies beneath one (never a name inside the workspace's `objects/`, `refs/` ...;
    under `modules/` or `worktrees/` a name such as `refs` may be a submodule's, so any).
    What an effect rule may not allow (effect_rules; `.git` itself is a mount point the
    program cannot replace, and an effect rule no file `.git`)."""
    # (names folded: on a case-insensitive file system `.GIT/HOOKS/x` is `.git/hooks/x`)
    parts = [fold(part) for part in path.split("/") if part not in ("", ".")]
    for start, first in enumerate(parts):
        if first != ".git":
            continue
        nested = False
        for part in parts[start + 1 :]:
            if part in FILES or part in DIRECTORIES or part in INDEX_FILES:
                return True
            if part.startswith("sharedindex."):
                return True
            if part in GIT_OWN and not nested:
                break
            nested = nested or part in ("modules", "worktrees")
    return False


# What git reads of a git directory by name (`_looks_like_git_directory` and the guarded
# names): a file tool's write of one in a directory that is a git directory to git, or
# becomes one by the write, is git metadata (`in_git_directory`).
GIT_READ_NAMES = _GIT_DIRECTORY_NAMES | {*FILES, *DIRECTORIES, "modules", "worktrees"}


def in_git_directory(workspace: Path, relative: str) -> bool:
    """Whether writing `relative` (a path of the workspace, links resolved) writes what
    git reads of a directory (but a `.git` itself) that git takes for a git directory by
    its own names, or that becomes one by the write: `x/hooks/post-receive` of a bare
    repository `x`, `src/HEAD` beside `src/objects/` and `src/refs/`, and one inside a
    `.git` (`.git/modules/lib/HEAD`; `.git/objects/xx/HEAD` beside the `objects/`,
    `refs/` and `hooks/pre-receive` a run made there, which `_remove_hidden_repositories`
    leaves, being no git directory yet: a remote URL naming it had a person's `git push`
    run the hook). The file tools write outside the sandbox, where no run's check
    follows them: a command made `src/config` (core.pager), which is no git metadata
    alone, and a write_file of `src/HEAD` would have made `src/` a git directory for a
    person's git. (What a `.git` itself holds: `guarded_path`.) A directory that cannot
    be listed counts as one."""
    current = Path(workspace)
    for part in [part for part in relative.split("/") if part not in ("", ".")]:
        named = git_name(part)
        if named is not None and fold(current.name) != ".git":
            try:
                names = _git_names(os.listdir(current))
            except (FileNotFoundError, NotADirectoryError):
                names = set()
            except OSError:
                return True
            if _looks_like_git_directory(names | {named}):
                return True
        current = current / part
    return False


def git_name(name: str) -> str | None:
    """The name git reads of a git directory (GIT_READ_NAMES) that `name` is on a
    case-insensitive file system (`fold`: `head` is `HEAD` on exFAT, and a write_file of
    `src/head` beside `src/Objects/` and `src/refs/` made `src/` a git directory), or None."""
    folded = fold(name)
    return next((known for known in GIT_READ_NAMES if fold(known) == folded), None)


def _git_names(names: list[str]) -> set[str]:
    """The names of `_GIT_DIRECTORY_NAMES` among a directory's `names` (as `git_name`)."""
    found = {git_name(name) for name in names}
    return {name for name in found if name in _GIT_DIRECTORY_NAMES}


def makes_git_directory(workspace: Path, paths: list[str]) -> bool:
    """Whether writing all of `paths` (an effect's changes, applied together outside the
    sandbox) writes what git reads of a git directory (`in_git_directory`), or makes a
    directory one by its own names with what they add together: an effect rule checked
    each path alone against the disk, and a command that ran `git init --bare x` with a
    hook (`x/HEAD`, `x/objects/...`, `x/refs/...`, `x/hooks/...`, none a git directory's
    on the disk before) was allowed and applied, and the person's `git branch` in `x` ran
    the hook."""
    if any(in_git_directory(workspace, path) for path in paths):
        return True
    # (by the directory's folded names: `Src/HEAD` and `src/objects/x` are one directory
    # on a case-insensitive file system; the names found first are the ones looked at)
    added: dict[tuple[str, ...], tuple[list[str], set[str]]] = {}
    for path in paths:
        parts = [part for part in path.split("/") if part not in ("", ".")]
        for index, part in enumerate(parts):
            named = git_name(part)
            if named is not None and named in _GIT_DIRECTORY_NAMES:
                key = tuple(fold(word) for word in parts[:index])
                added.setdefault(key, (parts[:index], set()))[1].add(named)
    for key, (where, names) in added.items():
        if key[-1:] == (".git",):
            continue  # (a `.git` itself: guarded_path)
        current = Path(workspace).joinpath(*where)
        try:
            there = _git_names(os.listdir(current))
        except (FileNotFoundError, NotADirectoryError):
            there = set()
        except OSError:
            return True
        if _looks_like_git_directory(there | names):
            return True
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
    output += "".join(result.notes)
    if result.entries and any(sign in output for sign in SIGNS):
        output += NOTE
    return output


def remove_made(result: Guard) -> list[str]:
    """Remove (never following a symlink) what the command made where a guarded name did
    not exist, and each directory or link it added in a `containers` directory; the names
    removed. Also after a run that failed or timed out. Raises ToolError when one cannot
    be removed."""
    removed: list[str] = []
    failures = _Failures()
    for dir_fd, name in result.absent:
        with failures.step():
            if _remove(dir_fd, name, name, directories_only=False):
                removed.append(name)
    for dir_fd, label, known in result.containers:
        try:
            names = _names(dir_fd)
        except OSError:
            continue
        for name in sorted(set(names) - known):
            with failures.step():
                if _remove(dir_fd, name, label + name, directories_only=True):
                    removed.append(label + name)
    # each check runs whatever one before it raised (a walk past MAX_WALK in a submodule's
    # git directory skipped the todos, strategies, indexes and made repositories of every
    # git directory): the errors are raised once all have run
    for check in (
        _keep_git_directories,
        _defuse_todos,
        _defuse_strategies,
        _remove_hidden_repositories,
        _check_indexes,
        _remove_made_repositories,
    ):
        with failures.step():
            check(result)
    failures.raise_any()
    return removed


class _Failures:
    """The ToolErrors of the steps of one check, each step run whatever one before it
    raised (fail closed: the first is raised, with the others, once all have run)."""

    def __init__(self) -> None:
        self.errors: list[ToolError] = []

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        try:
            yield
        except ToolError as error:
            self.errors.append(error)

    def raise_any(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            said = list(dict.fromkeys(str(error) for error in self.errors))
            raise ToolError(" ".join(said))


HEAD_READ = 255  # bytes of HEAD git's validate_headref reads (a buffer of 256, NUL-ended)


def _valid_head(dir_fd: int, digits: int) -> bytes | None:
    """The `HEAD` of the directory `dir_fd` when git reads it as a git directory's
    (validate_headref: a regular file holding `ref: refs/...` or an object id of `digits`
    hex digits, the superproject's object format: 40 of them read as one in a sha256
    superproject made `.git/modules/x` no git directory for git), or None. Of the
    first 255 bytes, as git reads them: `ref:`, 247 spaces and `refs/...` matched in 256
    was no git directory's HEAD for git, its `objects/` left to a planted one."""
    try:
        fd = os.open(
            "HEAD", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, 4096)  # (all of it put back, should the run spoil it)
    finally:
        os.close(fd)
    if re.match(rb"ref:[ \t\n]*refs/|[0-9a-fA-F]{%d}" % digits, data[:HEAD_READ]):
        return data
    return None


def _keep_git_directories(result: Guard) -> None:
    """After the run, each git directory under `modules/` or `worktrees/` whose own
    directories were left unguarded: git refuses a submodule's git directory inside
    another's only while that other is a git directory (validate_submodule_git_dir), and
    uses one there without asking in other paths (a recursive checkout). An unapproved
    command copied a hand-built git directory with a post-checkout hook to
    `.git/modules/x/objects/evil`, named it a submodule and removed
    `.git/modules/x/HEAD`; the person's `git submodule update --init` ran the hook. So a
    directory in its own directories that git would take as a git directory (`HEAD` with
    `objects/` and `refs/`, or `commondir`) is removed, and its HEAD, `objects/` and
    `refs/` are put back when the run removed or spoiled them; the model is told."""
    workspace = result.workspace
    failures = _Failures()
    for fd, target, head, digits, links in result.owners:
        shown = str(target.relative_to(workspace)) if workspace else target.name
        try:
            names = set(_names(fd))
        except OSError:
            continue  # (moved or removed: nothing of it for git to take)
        planted: list[str] = []
        for name in sorted(names & (GIT_OWN - set(DIRECTORIES))):
            with failures.step():  # (past MAX_WALK: HEAD is still put back, and the rest)
                planted += _remove_hand_built(fd, name, f"{shown}/{name}")
        with failures.step():
            _keep_git_directory(fd, shown, head, digits, links, names, planted, result)
    failures.raise_any()


HIDDEN = (
    "\n[harness: this command ran without a person's approval and made a directory inside "
    "a git directory that git would take for a git directory of its own (a remote or "
    "submodule URL naming it has a person's `git push` run its hooks and configuration "
    "on their machine); {names} was removed. A command a reviewer approves may make one.]"
)


# (the kernel stamps a ctime from a clock that lags by up to a tick: a link made just
# after the guard may bear a time before it)
LINK_MARGIN_NS = 2_000_000_000
UNLINKED = (
    "\n[harness: this command ran without a person's approval and left {names} in a git "
    "directory as a symbolic link or a FIFO, through which a person's git would write "
    "where it points (a `COMMIT_EDITMSG` or `logs/HEAD` linked to a file outside the "
    "workspace: their `git commit` wrote its message there), or on which it would hang "
    "(a FIFO at `HEAD` hung their `git status`); it was removed. A command a reviewer "
    "approves may make one.]"
)


def _remove_hidden_repositories(result: Guard) -> None:
    """After the run, each directory inside the workspace's `.git` or a nested repository's
    (in `objects/`, `refs/`, `logs/`, or any other it made there: the walk enters no
    `.git`) that git would take for a git directory (`HEAD` with `objects` and `refs`, or
    `commondir`), and each `.git` there, is removed (`_remove_hidden`; `modules/` and
    `worktrees/` are `_keep_git_directories`', the bound `hooks/` ... cannot change).
    Before, an unapproved `git init --bare .git/objects/xx` with a `pre-receive` hook and
    a `git init sub` whose `remote.origin.url` (a key git itself sets) named
    `../.git/objects/xx` had the person's `git push` in `sub` run the hook on the host.
    And in every guarded git directory, each symbolic link the run made, moved or linked
    (its ctime since the guard was made; git makes none: a `HEAD` naming `refs/...` aside)
    is removed: git writes through one (`COMMIT_EDITMSG`, `MERGE_MSG`, `FETCH_HEAD`,
    a reflog, a directory of `refs/`), and `.git/COMMIT_EDITMSG -> ~/.bashrc` had the
    person's `git commit -m` write its message over a file outside the workspace. So is
    one older than the guard, but a symbolic ref and the person's `objects -> ...`
    (`_old_link_kept`): one planted before Harness looked (an upgrade), or by a command
    a reviewer approved, was kept for good, and git wrote through it at every commit. So is
    each FIFO, whenever made (git makes none, and waits on one it opens by name: a FIFO
    at `HEAD` hung every `git status` of the person's, one at `COMMIT_EDITMSG` their
    `git commit -m`)."""
    failures = _Failures()
    planted: list[str] = []
    unlinked: list[str] = []
    since = result.started - LINK_MARGIN_NS
    # (a submodule's `objects -> /srv/store/x` the run replaced, made again as it was:
    # `_put_back_links`)
    kept = {
        (_identity(fd), name, link) for fd, _, _, _, links in result.owners for name, link in links
    }
    guarded: set[tuple[int, int]] = set()
    for fd, _, _, _ in result.indexes:
        with contextlib.suppress(OSError):
            guarded.add(_identity(fd))
    for fd, target, _, _ in result.indexes:
        shown = str(target.relative_to(result.workspace)) if result.workspace else target.name
        try:
            names = _names(fd)
        except OSError:
            continue
        for name in sorted(set(names) - {*FILES, *DIRECTORIES}):
            with failures.step():
                info = _lstat(fd, name)
                if info is None:
                    continue
                if _blocks(info.st_mode):
                    # (a FIFO at `HEAD` hung every `git status` of the person's)
                    if _remove(fd, name, f"{shown}/{name}", directories_only=False):
                        unlinked.append(f"{shown}/{name}")
                    continue
                if stat.S_ISLNK(info.st_mode):
                    was = (_identity(fd), name, _link_target(fd, name)) in kept
                    if info.st_ctime_ns >= since:
                        gone = not (was or _symbolic_head(fd, name))
                    else:
                        gone = not (was or _old_link_kept(fd, name))
                    if gone and _remove(fd, name, f"{shown}/{name}", directories_only=False):
                        unlinked.append(f"{shown}/{name}")
                    continue
                if not stat.S_ISDIR(info.st_mode) or (info.st_dev, info.st_ino) in guarded:
                    continue  # (a guarded one is looked at on its own)
                hidden, links = _remove_hidden(
                    fd, name, f"{shown}/{name}", target.name == ".git", since
                )
                planted += hidden
                unlinked += links
    if planted:
        result.notes.append(HIDDEN.format(names=", ".join(f"'{path}'" for path in planted[:10])))
    if unlinked:
        result.notes.append(UNLINKED.format(names=_some(unlinked)))
    failures.raise_any()


def _symbolic_head(dir_fd: int, name: str) -> bool:
    """Whether `name` is a `HEAD` that is a symbolic link git reads as a symbolic ref
    (`refs/...`, no `..`: core.preferSymlinkRefs), which git writes through to that ref."""
    return name == "HEAD" and _symbolic_ref(dir_fd, name)


def _symbolic_ref(dir_fd: int, name: str) -> bool:
    """Whether the symbolic link `name` names `refs/...` with no `..`, which git reads as
    a symbolic ref (core.preferSymlinkRefs): it writes the ref, inside the git directory."""
    target = _link_target(dir_fd, name)
    return target is not None and target.startswith("refs/") and ".." not in target.split("/")


# The links of a git directory's own names a person keeps (objects, LFS or annex content
# stored elsewhere: `objects -> /srv/store/x`), kept whatever their age and target:
# without `objects/` or `refs/` git takes the directory for no git directory at all.
KEPT_LINKS = frozenset({"objects", "refs", "lfs", "annex"})


def _refuse_kept_links_inside(workspace: Path, result: Guard) -> None:
    """ToolError (nothing runs) when one of KEPT_LINKS of a guarded git directory names a
    directory a command could write (inside the workspace: `.git/objects -> ../store`):
    what is there is the git directory's to git, but no walk after a run looks there, as
    it is the work tree's. An unapproved `ln -s /dev/zero store/info/alternates` (or
    `myrefs/heads/x -> /dev/zero` under `refs -> ../myrefs`) hung the person's `git
    status` (`git branch`), reading without end; a link there to a file outside is one
    git writes through, as one in `.git` is (`_remove_hidden_repositories`)."""
    for fd, target, _, _ in result.indexes:
        for name in sorted(KEPT_LINKS):
            named = _link_target(fd, name)
            if named is None:
                continue
            path = named if named.startswith("/") else f"{target}/{named}"
            if _outside(workspace, path):
                continue
            shown = f"'{target.relative_to(workspace)}/{name}' (a link to {named!r})"
            raise ToolError(
                f"The workspace's git metadata holds {shown}, naming a directory a command "
                "could write, whose links and files git reads as its own: a command no "
                "person approved could make a person's git hang there or write through a "
                "link, so nothing ran. A reviewer must approve this command."
            )


def _old_link_kept(dir_fd: int, name: str) -> bool:
    """Whether a symbolic link `name` of a git directory that was there before the guard
    (its ctime older) is kept after an unapproved run: a symbolic ref, or one of
    KEPT_LINKS. Any other is removed, however old: one made before Harness removed links
    (an upgrade), or by a command a reviewer approved, or by the person, is written
    through by git all the same (`.git/COMMIT_EDITMSG -> ~/.bashrc`, planted then, had
    the person's `git commit -m` write its message over that file after every later
    run), and git makes none; the person loses a link of their own there (`logs`,
    `description`), which git makes again as a file or directory of its own."""
    return _symbolic_ref(dir_fd, name) or name in KEPT_LINKS


def _hidden_in(
    git_fd: int, name: str, since: int | None = None
) -> tuple[int, list[str], list[str], list[str]] | None:
    """The directory `name` of the git directory `git_fd` opened (no link followed), with
    the `.git` entries and the directories git takes for a git directory by their own
    names (`_looks_like_git_directory`; `` for itself) at any depth in it, relative to
    it, as the walk of the work tree finds them (`_walk`: no bound, linear at any depth,
    as after a run: what is there was made by the command or is git's own); None when it
    is no directory. ToolError when it cannot be searched. The caller closes it."""
    try:
        top = os.open(name, _WALK_FLAGS, dir_fd=git_fd)
    except OSError:
        return None  # (a file, a link, gone)
    try:
        bare: list[tuple[str, tuple[int, int]]] = []
        links: list[str] = []
        found = _walk(top, None, bare, links if since is not None else None, since or 0)
    except (_Unchecked, OSError) as error:
        os.close(top)
        why = str(error) if isinstance(error, _Unchecked) else (error.strerror or str(error))
        raise ToolError(
            f"The command ran without a person's approval, and '{name}' of a git directory "
            f"could not be searched afterwards for a git directory hidden in it ({why}), "
            "which a remote's URL may name. Do not run git in this workspace; an operator "
            "must look at it."
        ) from None
    return top, [path for path, _, _ in found], [path for path, _ in bare], links


def _remove_hidden(
    git_fd: int, name: str, shown: str, repositories: bool, since: int
) -> tuple[list[str], list[str]]:
    """`_remove_hidden_repositories` for the directory `name` of one git directory: with
    `repositories`, each `.git` and each git directory by its names in it is removed
    whole (git makes none there), and `name` itself, when git takes it for one (`logs/`
    with an `objects/` made beside its HEAD and `refs/`), loses its HEAD; and each
    symbolic link in it whose ctime is `since` or later is removed. The paths removed
    (of git directories, of links)."""
    held = _hidden_in(git_fd, name, since)
    if held is None:
        return [], []
    top, dot_gits, bare, links = held
    removed: list[str] = []
    unlinked: list[str] = []
    found = sorted({*dot_gits, *bare}, key=lambda item: (item.count("/"), item))
    try:
        for path in found if repositories else []:
            if any(path.startswith(done + "/") for done in removed):
                continue  # (within one removed whole)
            if _remove_at(top, path, shown):
                removed.append(path)
        for path in links:
            within = any(path.startswith(done + "/") for done in removed if done)
            if not within and _remove_at(top, path, shown):
                unlinked.append(path)
    finally:
        os.close(top)
    hidden = [f"{shown}/{path}" if path else f"{shown}/HEAD" for path in removed]
    return hidden, [f"{shown}/{path}" for path in unlinked]


def _remove_at(top: int, path: str, shown: str) -> bool:
    """Remove `path` (relative to the directory `top`; `` for its HEAD), no link followed."""
    parts = path.split("/") if path else []
    target, last = (parts[:-1], parts[-1]) if parts else ([], "HEAD")
    try:
        parent = _open_path(top, target)
    except OSError:
        return False
    try:
        here = "/".join([shown, *parts]) if parts else f"{shown}/HEAD"
        return _remove(parent, last, here, directories_only=False)
    finally:
        os.close(parent)


def _keep_git_directory(
    fd: int,
    shown: str,
    head: bytes,
    digits: int,
    links: list[tuple[str, str]],
    names: set[str],
    planted: list[str],
    result: Guard,
) -> None:
    """`_keep_git_directories` for one git directory, once what was planted is removed."""
    if planted:
        found = ", ".join(f"'{path}'" for path in planted)
        result.notes.append(PLANTED.format(names=found))
    spoiled: list[str] = []
    if _valid_head(fd, digits) is None:
        _remove(fd, "HEAD", f"{shown}/HEAD", directories_only=False)
        _put_back(fd, "HEAD", head, f"{shown}/HEAD")
        spoiled.append("HEAD")
    kept = _put_back_links(fd, links, shown)
    if kept:
        result.notes.append(RELINKED.format(names=", ".join(kept), path=shown))
    linked = {name for name, _ in links}
    for name in () if "commondir" in names else ("objects", "refs"):
        # (a worktree's are its common directory's; a link that was there is kept)
        if name in linked:
            continue
        info = _lstat(fd, name)
        if info is None or not stat.S_ISDIR(info.st_mode):
            _remove(fd, name, f"{shown}/{name}", directories_only=False)
            _put_back(fd, name, None, f"{shown}/{name}")
            spoiled.append(f"{name}/")
    if spoiled:
        result.notes.append(SPOILED.format(names=", ".join(spoiled), path=shown))


def _own_links(dir_fd: int, where: Path, result: Guard) -> list[tuple[str, str]]:
    """The `objects` and `refs` of the git directory `dir_fd` (at `where`) that are
    symbolic links (a person's objects kept elsewhere): (name, what it names). Not
    followed. ToolError (nothing runs) for one that names no directory outside the
    workspace (`_outside`): the command writes what it names, where the guard, following
    no link, looks for no git directory planted. With `objects` and `refs` linked into
    the work tree, an unapproved command moved the directory `refs` names away (the
    submodule's git directory then none to git, which so stops refusing one nested in
    it), copied a hand-built git directory into the one `objects` names and named it a
    submodule: the person's `git submodule update --init` ran its hook."""
    links: list[tuple[str, str]] = []
    for name in ("objects", "refs"):
        target = _link_target(dir_fd, name)
        if target is None:
            continue
        named = os.path.join(where, target)
        if result.workspace is not None and not _outside(result.workspace, named):
            shown = where.relative_to(result.workspace) / name
            raise ToolError(
                f"The workspace's git metadata holds '{shown}', a symbolic link into the "
                f"workspace ({target!r}) or to what a sandboxed command may write, whose "
                "directory cannot be checked for a git directory planted in it, so "
                "nothing ran. A reviewer must approve this command (or keep it outside "
                "the workspace)."
            )
        links.append((name, target))
    return links


def _put_back_links(dir_fd: int, links: list[tuple[str, str]], shown: str) -> list[str]:
    """Each link of `_own_links` the run removed or replaced made again as the same link
    (what was there in its place removed first, never followed); the names put back. A
    person's `objects -> /srv/store/x` was taken for objects/ the run removed and made an
    empty directory: the submodule lost every object. Its target is not looked at: the
    run could not write outside the workspace, and one inside it is the person's."""
    put_back: list[str] = []
    for name, target in links:
        if _link_target(dir_fd, name) == target:
            continue  # (by what it names: a directory made in its place took its inode)
        _remove(dir_fd, name, f"{shown}/{name}", directories_only=False)
        try:
            os.symlink(target, name, dir_fd=dir_fd)
            if os.geteuid() == 0:
                owner = os.fstat(dir_fd)
                os.chown(name, owner.st_uid, owner.st_gid, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as error:
            raise ToolError(
                f"The command ran without a person's approval and removed the link "
                f"'{shown}/{name}' (to {target!r}) of a submodule's git directory, which "
                f"could not be put back ({error.strerror or error}). Do not run git in "
                "this workspace; an operator must look at it."
            ) from None
        put_back.append(f"{name} (a link to {target!r})")
    return put_back


def _link_target(dir_fd: int, name: str) -> str | None:
    """What the symbolic link `name` in `dir_fd` names, or None when it is no link."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return None


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _put_back(dir_fd: int, name: str, data: bytes | None, shown: str) -> None:
    """Make `name` in `dir_fd` again: a file holding `data`, or a directory (None), owned
    as `dir_fd` is (the sandbox user's, when Harness is root: git writes there next)."""
    try:
        owner = os.fstat(dir_fd)
        if data is None:
            os.mkdir(name, 0o755, dir_fd=dir_fd)
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        if os.geteuid() == 0:
            os.chown(name, owner.st_uid, owner.st_gid, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as error:
        raise ToolError(
            f"The command ran without a person's approval and removed '{shown}' of a "
            "submodule's git directory, which could not be put back "
            f"({error.strerror or error}). Do not run git in this workspace; an operator "
            "must look at it."
        ) from None


def _remove_hand_built(root: int, top: str, shown: str) -> list[str]:
    """Remove every directory at or under `top` in `root` that git would take as a git
    directory (`HEAD` with `objects` and `refs`, or `commondir`): `top` itself loses its
    HEAD, one inside it goes whole. Depth first with a stack of names, no link followed; past MAX_WALK entries
    ToolError (it cannot be told)."""
    removed: list[str] = []
    stack: list[list[str]] = [[top]]
    seen = 0
    while stack:
        parts = stack.pop()
        try:
            fd = _open_path(root, parts)
        except OSError:
            continue  # (not a directory, or gone)
        try:
            opened = os.open(".", _WALK_FLAGS, dir_fd=fd)
            try:
                with os.scandir(opened) as listing:
                    entries = [(item.name, item.is_dir(follow_symlinks=False)) for item in listing]
            finally:
                os.close(opened)
            seen += len(entries)
            if seen > MAX_WALK:
                raise ToolError(
                    f"The command ran without a person's approval, and '{shown}' of a "
                    f"submodule's git directory now holds more than {MAX_WALK} entries, "
                    "too many to check for a git directory planted there. Do not run git "
                    "in this workspace; an operator must look at it."
                )
            names = {name for name, _ in entries}
            here = "/".join([shown, *parts[1:]])
            if "HEAD" in names and ("commondir" in names or {"objects", "refs"} <= names):
                if len(parts) == 1:
                    _remove(fd, "HEAD", f"{here}/HEAD", directories_only=False)
                    removed.append(f"{here}/HEAD")
                else:
                    parent = _open_path(root, parts[:-1])
                    try:
                        _remove(parent, parts[-1], here, directories_only=True)
                    finally:
                        os.close(parent)
                    removed.append(here)
                    continue
            stack += [[*parts, name] for name, directory in entries if directory]
        finally:
            os.close(fd)
    return removed


def _hand_built_in(root: int, top: str) -> str | None:
    """Where in the directory `top` of the git directory `root` lies a `.git` or a
    directory git takes for a git directory by its own names (`_hidden_in`), or a
    symbolic link (git makes none there, and writes through one: a made `logs/HEAD ->
    ~/.bashrc`), or None; that it cannot be searched, if so."""
    try:
        held = _hidden_in(root, top, 0)
    except ToolError:
        return f"'{top}/', which cannot be searched"
    if held is None:
        return None
    fd, dot_gits, bare, links = held
    os.close(fd)
    for path in sorted([*dot_gits, *bare]):
        return f"a git directory at '{top}/{path}'" if path else f"'{top}/' a git directory"
    for path in sorted(links):
        return f"the symbolic link or FIFO '{top}/{path}'"
    return None


def _index_state(dir_fd: int) -> tuple[int, ...] | None:
    """What tells whether the `index` in the git directory `dir_fd`, or a split index's
    shared part beside it (`sharedindex.*`, which git reads with it), changed, or None
    when there is no index."""
    try:
        info = os.stat("index", dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    state = [info.st_mode, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]
    for name, shared in _shared_indexes(dir_fd):
        state += [hash(name), shared.st_mode, shared.st_ino, shared.st_size, shared.st_ctime_ns]
    return tuple(state)


def _shared_indexes(dir_fd: int) -> list[tuple[str, os.stat_result]]:
    """The `sharedindex.*` entries of the git directory `dir_fd`, lstat'ed, by name."""
    found: list[tuple[str, os.stat_result]] = []
    try:
        names = _names(dir_fd)
    except OSError:
        return found
    for name in sorted(names):
        if name.startswith("sharedindex."):
            with contextlib.suppress(OSError):
                found.append((name, os.stat(name, dir_fd=dir_fd, follow_symlinks=False)))
    return found


def _index_bytes(dir_fd: int) -> int:
    """The bytes git reads as the index of the git directory `dir_fd`: its `index` and
    every `sharedindex.*` beside it (not followed)."""
    total = 0
    with contextlib.suppress(OSError):
        total += os.stat("index", dir_fd=dir_fd, follow_symlinks=False).st_size
    return total + sum(info.st_size for _, info in _shared_indexes(dir_fd))


def _index_cost(dir_fd: int, object_format: str, left: int) -> int:
    """What git makes of the index of the git directory `dir_fd` in bytes: its files'
    (`_index_bytes`) and, for each in version 4, its paths written out (`_packed_paths`).
    More than `left` as soon as that is known (not read further)."""
    size = _index_bytes(dir_fd)
    names = ["index", *(name for name, _ in _shared_indexes(dir_fd))]
    for name in names:
        if size > left:
            break
        size += _packed_paths(dir_fd, name, object_format, left - size + 1)
    return size


def _packed_paths(dir_fd: int, name: str, object_format: str, limit: int) -> int:
    """The bytes of the paths git makes whole of the index file `name` in `dir_fd` when it
    is of version 4 (read_index_from, on one thread: `_bad_index`), else 0; more than
    `limit` as soon as they are. Version 4 stores each path as what it keeps of the one
    before and what it adds: six bytes on disk made a path of 32 KiB in git's memory and
    its listing (2 MiB of index, 1 GiB), and one more byte each a path one longer than the
    one before. A file git cannot read so counts what was read until then: git stops
    there too."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return 0
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return 0
        with open(fd, "rb", closefd=False) as file:
            data = file.read()
    finally:
        os.close(fd)
    if data[:4] != b"DIRC" or data[4:8] != (4).to_bytes(4, "big"):
        return 0
    fixed = 40 + (32 if object_format == "sha256" else 20)  # stat data and object id
    entries = int.from_bytes(data[8:12], "big")
    total = previous = 0
    at = 12
    for number in range(entries):
        if at + fixed + 2 > len(data):
            break
        flags = int.from_bytes(data[at + fixed : at + fixed + 2], "big")
        at += fixed + (4 if flags & 0x4000 else 2)  # (an extended entry's second flags)
        strip, at = _varint(data, at)
        if strip is None or (number and strip > previous):
            break
        kept = previous - strip if number else 0
        length = flags & 0xFFF
        if length == 0xFFF:  # (long: to its NUL)
            end = data.find(b"\0", at)
            if end < 0:
                break
            length = kept + end - at
        elif length < kept:
            break
        at += length - kept + 1
        total += length
        previous = length
        if total > limit:
            break
    return total


def _varint(data: bytes, at: int) -> tuple[int | None, int]:
    """git's decode_varint at `at` in `data`: the value and where it ends (too large: 0
    where it began, as git reads it; None past the end of `data`)."""
    start = at
    if at >= len(data):
        return None, at
    byte = data[at]
    at += 1
    value = byte & 127
    while byte & 128:
        value += 1
        if value >= 1 << 57:
            return 0, start
        if at >= len(data):
            return None, at
        byte = data[at]
        at += 1
        value = (value << 7) + (byte & 127)
    return value, at


def index_limit(before: int) -> int:
    """The most bytes of index (`_index_bytes`) git reads after a run that found
    `before`: INDEX_LIMIT, or twice what there was before and INDEX_MARGIN."""
    return max(INDEX_LIMIT, 2 * before + INDEX_MARGIN)


TODO = ("rebase-merge", "git-rebase-todo")
_EXEC = re.compile(r"[ \t]*(exec|x)([ \t]|$)")
EXEC_REMOVED = (
    "\n[harness: this command ran without a person's approval and left `exec` lines in "
    "the rebase under way in '{path}' ({lines}), which a person's `git rebase --continue` "
    "would run on their machine; they were made comments. A command a reviewer approves "
    "may add them.]"
)


TODO_LINK = (
    "\n[harness: this command ran without a person's approval and left '{path}' as a "
    "symbolic link or special file, through which a person's `git rebase --continue` "
    "would read commands no one checked; it was removed.]"
)


def _read_todo(dir_fd: int) -> bytes | None:
    """The rebase todo (`rebase-merge/git-rebase-todo`) of the git directory `dir_fd`,
    neither followed nor waited for, or None when there is no such regular file. ToolError
    past _READ_LIMIT."""
    data = _read_state(dir_fd, *TODO)
    if data is not None and len(data) > _READ_LIMIT:
        raise ToolError(
            "The workspace's git directory holds a rebase todo of more than 1 MiB, which "
            "cannot be checked for a command no person approved, so nothing ran. A "
            "reviewer must approve this command."
        )
    return data


def _exec_lines(dir_fd: int) -> frozenset[str] | None:
    """The `exec` (`x`) lines of the git directory's rebase todo, or None with no todo."""
    data = _read_todo(dir_fd)
    if data is None:
        return None
    lines = data.decode("utf-8", "surrogateescape").split("\n")
    return frozenset(line for line in lines if _EXEC.match(line))


def _defuse_todos(result: Guard) -> None:
    """After the run, each `exec` line of a guarded git directory's rebase todo that was not
    there before is made a comment (`# exec ...`): a person's `git rebase --continue` runs
    them on the host, outside any sandbox. Before, an unapproved `git rebase -i -x CMD`
    stopped at a `break` (or on a conflict) left them, and the person's continue ran CMD.
    The picks stay: the rebase goes on as before, without those commands."""
    failures = _Failures()
    for fd, target, before in result.todos:
        with failures.step():
            _defuse_todo(fd, target, before, result)
    failures.raise_any()


def _defuse_todo(fd: int, target: Path, before: frozenset[str] | None, result: Guard) -> None:
    """`_defuse_todos` for the git directory `fd` (at `target`)."""
    workspace = result.workspace
    shown = str(target.relative_to(workspace)) if workspace else target.name
    _remove_linked_todo(fd, shown, result)
    try:
        data = _read_todo(fd)
    except ToolError:
        # (removed, not just told: the model is told, the person's continue ran it;
        # and the checks after this one still run)
        _remove_todo(fd, shown, target)
        result.notes.append(TODO_TOO_LARGE.format(path=f"{shown}/{'/'.join(TODO)}"))
        return
    if data is None:
        return
    lines = data.decode("utf-8", "surrogateescape").split("\n")
    added = [line for line in lines if _EXEC.match(line) and line not in (before or ())]
    if not added:
        return
    out = [f"# {line.strip()}" if line in added else line for line in lines]
    _rewrite_todo(fd, "\n".join(out).encode("utf-8", "surrogateescape"), target)
    names = "; ".join(f"'{line.strip()[:80]}'" for line in added[:5])
    result.notes.append(EXEC_REMOVED.format(path=shown, lines=names))


TODO_TOO_LARGE = (
    "\n[harness: this command ran without a person's approval and left '{path}' of more "
    "than 1 MiB, which cannot be checked for `exec` lines a person's `git rebase "
    "--continue` would run on their machine; it was removed (`git rebase --abort` ends "
    "that rebase).]"
)


def _remove_todo(dir_fd: int, shown: str, target: Path) -> None:
    """Remove the rebase todo of the git directory `dir_fd`, no link followed."""
    try:
        merge = os.open(TODO[0], _PATH | os.O_DIRECTORY, dir_fd=dir_fd)
        try:
            _remove(merge, TODO[1], f"{shown}/{'/'.join(TODO)}", directories_only=False)
        finally:
            os.close(merge)
    except OSError as error:
        raise ToolError(
            f"The command ran without a person's approval and left a rebase todo in "
            f"'{target}' that cannot be checked (more than 1 MiB) nor removed "
            f"({error.strerror or error}). Do not run `git rebase --continue` there; an "
            "operator must look at it."
        ) from None


def _remove_linked_todo(dir_fd: int, shown: str, result: Guard) -> None:
    """A `rebase-merge` that is a symbolic link, or a todo in it that is not a regular
    file (a link git would follow to a todo no one read, a fifo), is removed: git makes
    neither."""
    info = _lstat(dir_fd, TODO[0])
    if info is None:
        return
    if stat.S_ISLNK(info.st_mode):
        _remove(dir_fd, TODO[0], f"{shown}/{TODO[0]}", directories_only=False)
        result.notes.append(TODO_LINK.format(path=f"{shown}/{TODO[0]}"))
        return
    if not stat.S_ISDIR(info.st_mode):
        return
    merge = os.open(TODO[0], _PATH | os.O_DIRECTORY, dir_fd=dir_fd)
    try:
        todo = _lstat(merge, TODO[1])
        if todo is not None and not stat.S_ISREG(todo.st_mode):
            _remove(merge, TODO[1], f"{shown}/{'/'.join(TODO)}", directories_only=False)
            result.notes.append(TODO_LINK.format(path=f"{shown}/{'/'.join(TODO)}"))
    finally:
        os.close(merge)


def _rewrite_todo(dir_fd: int, data: bytes, target: Path) -> None:
    """Replace the rebase todo of the git directory `dir_fd` with `data` (`_replace`)."""
    try:
        merge = os.open(TODO[0], _PATH | os.O_DIRECTORY, dir_fd=dir_fd)
        try:
            _replace(merge, TODO[1], data)
        finally:
            os.close(merge)
    except OSError as error:
        raise ToolError(
            f"The command ran without a person's approval and left `exec` lines in the "
            f"rebase todo of '{target}', which could not be removed "
            f"({error.strerror or error}). Do not run `git rebase --continue` there; an "
            "operator must look at it."
        ) from None


def _replace(parent: int, name: str, data: bytes) -> None:
    """Write `data` to `name` in the directory `parent`: a new file renamed over it, owned
    as its directory, no link followed. OSError when it cannot."""
    owner = os.fstat(parent)
    temporary = f"{ASIDE}{secrets.token_hex(8)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temporary, flags, 0o644, dir_fd=parent)
    try:
        os.write(fd, data)
        if os.geteuid() == 0:
            os.fchown(fd, owner.st_uid, owner.st_gid)
    finally:
        os.close(fd)
    os.rename(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)


# The files in which a rebase (`rebase-merge/strategy`) and a cherry-pick or revert
# (`sequencer/opts`: `options.strategy`) record the merge strategy their `--continue`
# uses: git runs a strategy of its own in itself and any other as the program
# `git-merge-<strategy>`, which for one holding a `/` (`x/evil`) is a path in the work
# tree (`git-merge-x/evil`). And those in which they record the key to sign commits with
# (`gpg_sign_opt` of a rebase, of either backend; `options.gpg-sign`): the person's
# `--continue` runs their signing program (`gpg -bsau KEY`) on the commits the command
# chose, with the key it chose. What else these directories hold runs nothing (checked
# with git 2.39: the todo of a cherry-pick takes no `exec`, `strategy_opts` are `-X`
# options of git's own strategies, `head-name` and `update-refs` are refs git checks,
# `apply-opt` and the patches of `git am` write only paths git accepts in an index,
# `author-script` is read, not run, and `autostash` is a commit applied as one).
STRATEGY_FILES = (
    ("rebase-merge", "strategy"),
    ("sequencer", "opts"),
    ("rebase-merge", "gpg_sign_opt"),
    ("rebase-apply", "gpg_sign_opt"),
)
OWN_STRATEGIES = frozenset({"ort", "recursive", "resolve", "octopus", "ours", "subtree"})
STATE_LINKS = ("sequencer", "rebase-apply")  # (`rebase-merge`: `_remove_linked_todo`)
STRATEGY_PUT_BACK = (
    "\n[harness: this command ran without a person's approval and set the merge strategy "
    "of the {what} under way in '{path}' to {names}, which a person's {command} would run as a program on their machine; '{file}' was put back as it "
    "was before the command. A command a reviewer approves may set it.]"
)
SIGNING_PUT_BACK = (
    "\n[harness: this command ran without a person's approval and set the {what} under way "
    "in '{path}' to sign its commits ({names}), which a person's {command} would do with "
    "their own signing program and key on their machine; '{file}' was put back as it was "
    "before the command. A command a reviewer approves may set it.]"
)


def _read_state(dir_fd: int, directory: str, name: str) -> bytes | None:
    """The file `directory/name` of the git directory `dir_fd` (at most _READ_LIMIT + 1
    bytes), neither followed nor waited for, or None when there is no such regular file."""
    try:
        parent = os.open(directory, _PATH | os.O_DIRECTORY, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=parent)
    except OSError:
        return None
    finally:
        os.close(parent)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, _READ_LIMIT + 1)
    finally:
        os.close(fd)


def _foreign_strategies(
    name: str, data: bytes, was: bytes | None, target: Path, run: Guard
) -> list[str] | None:
    """What the state file `name` (STRATEGY_FILES) holds that a person's `--continue`
    would run: strategies git does not have, a signing key that was not there before the
    run (`was`) (`[]` for none), or None when it cannot be read (then it is taken for one
    that names one)."""
    if len(data) > _READ_LIMIT:
        return None
    if name == "strategy":  # (read as git reads it: one line, white space around it aside)
        value = data.decode("utf-8", "replace").strip()
        return [] if not value or value in OWN_STRATEGIES else [value]
    if name == "gpg_sign_opt":  # (`-S` or `-SKEY`, any line the run wrote: it changed)
        value = data.decode("utf-8", "replace").strip()
        return [value] if value else []
    try:
        pairs = _configuration(data, target, run)
        before = _configuration(was, target, run) if was is not None else []
    except ToolError:
        return None
    signing = {value for key, value in before if key == "options.gpg-sign"}
    found = []
    for key, value in pairs:
        if key.startswith("include"):
            found.append(f"{key} = {value}")
        elif key == "options.strategy" and value.strip() not in OWN_STRATEGIES:
            found.append(value)
        elif key == "options.gpg-sign" and value not in signing:
            found.append(f"gpg-sign = {value}")
    return found


def _defuse_strategies(result: Guard) -> None:
    """After the run, a merge strategy or signing file (STRATEGY_FILES) of a guarded git
    directory that the run changed to name a strategy git does not have, or a key to sign
    with (or that cannot be read) is put back as it was before the run (removed when
    there was none), and a `sequencer` or `rebase-apply` that is a symbolic link is
    removed: the person's `--continue` would run that strategy as `git-merge-<strategy>`,
    a program of the work tree for one holding a `/`, or their signing program. Before,
    `x/evil` in `rebase-merge/strategy` (or `options.strategy` in `sequencer/opts`) and
    `git-merge-x/evil` in the work tree had the person's continue run `evil` on the host;
    `-S` in `rebase-merge/gpg_sign_opt` had it run `gpg -bsau` on the commits the command
    chose."""
    failures = _Failures()
    for fd, target, before in result.strategies:
        with failures.step():
            _defuse_strategy(fd, target, before, result)
    failures.raise_any()


def _defuse_strategy(fd: int, target: Path, before: list[bytes | None], result: Guard) -> None:
    """`_defuse_strategies` for the git directory `fd` (at `target`)."""
    workspace = result.workspace
    shown = str(target.relative_to(workspace)) if workspace else target.name
    failures = _Failures()
    for link in STATE_LINKS:
        info = _lstat(fd, link)
        if info is not None and stat.S_ISLNK(info.st_mode):
            with failures.step():
                _remove(fd, link, f"{shown}/{link}", directories_only=False)
                result.notes.append(TODO_LINK.format(path=f"{shown}/{link}"))
    for (directory, name), was in zip(STRATEGY_FILES, before, strict=True):
        with failures.step():
            _defuse_state_file(fd, target, shown, directory, name, was, result)
    failures.raise_any()


def _defuse_state_file(
    fd: int, target: Path, shown: str, directory: str, name: str, was: bytes | None, run: Guard
) -> None:
    """`_defuse_strategies` for the file `directory/name` of the git directory `fd`."""
    file = f"{shown}/{directory}/{name}"
    try:
        parent = os.open(directory, _PATH | os.O_DIRECTORY, dir_fd=fd)
    except OSError:
        return  # (none; `rebase-merge` a link: `_defuse_todos` removed it)
    try:
        info = _lstat(parent, name)
        if info is None:
            return
        data = _read_state(fd, directory, name) if stat.S_ISREG(info.st_mode) else None
        if data is not None and data == was:
            return
        where = target / directory / name
        found = None if data is None else _foreign_strategies(name, data, was, where, run)
        if found == []:
            return
        _remove(parent, name, file, directories_only=False)
        if was is not None:
            _write_state(parent, name, was, target)
        what, command = (
            ("cherry-pick or revert", "`git cherry-pick --continue` (`revert`)")
            if directory == "sequencer"
            else ("rebase", "`git rebase --continue`")
        )
        names = ", ".join(repr(item[:80]) for item in found or ["what could not be read"])
        note = SIGNING_PUT_BACK if name == "gpg_sign_opt" else STRATEGY_PUT_BACK
        if name == "opts" and found and all(item.startswith("gpg-sign = ") for item in found):
            note = SIGNING_PUT_BACK
        run.notes.append(
            note.format(what=what, path=shown, names=names, command=command, file=file)
        )
    finally:
        os.close(parent)


def _write_state(parent: int, name: str, data: bytes, target: Path) -> None:
    """Write `data` to `name` in the directory `parent` of a git directory (`_replace`)."""
    try:
        _replace(parent, name, data)
    except OSError as error:
        raise ToolError(
            f"The command ran without a person's approval and changed the merge strategy "
            f"or signing key of an operation under way in '{target}', which could not be put back "
            f"({error.strerror or error}). Do not run `git rebase --continue` or `git "
            "cherry-pick --continue` there; an operator must look at it."
        ) from None


def _check_indexes(result: Guard) -> None:
    """Remove each guarded git directory's `index` the run changed that names a path git
    itself would never put there (`_bad_index_path`), and say so. git reads an
    index without checking its paths: one crafted with `.git/hooks/post-commit` or
    `../../.bashrc` had a person's `git checkout -- .` (or `git restore .`) write that
    file, and their next commit run it."""
    failures = _Failures()
    for dir_fd, target, before, _ in result.indexes:
        with failures.step():
            _check_index(dir_fd, target, before, result)
    failures.raise_any()


def _check_index(dir_fd: int, target: Path, before: tuple[int, ...] | None, result: Guard) -> None:
    """`_check_indexes` for the git directory `dir_fd` (at `target`)."""
    workspace = result.workspace
    after = _index_state(dir_fd)
    if after is None or after == before:
        return
    shown = str((target / "index").relative_to(workspace)) if workspace else "index"
    object_format = _object_format(dir_fd)
    limit = result.index_budget
    size = _index_cost(dir_fd, object_format, limit)
    if not _take_index_budget(result, size):
        # not read: git takes time in proportion (a crafted index of 1 GiB held the
        # worker for minutes), and nothing the run grew so far is the person's
        removed = _remove(dir_fd, "index", shown, directories_only=False)
        for name, _ in _shared_indexes(dir_fd):
            removed = _remove(dir_fd, name, name, directories_only=False) or removed
        if removed:
            result.notes.append(
                INDEX_TOO_LARGE.format(path=shown, size=size >> 20, limit=limit >> 20)
            )
        return
    why = _bad_index(dir_fd, object_format)
    if why is None:
        return
    if _remove(dir_fd, "index", shown, directories_only=False):
        result.notes.append(INDEX.format(path=shown, why=why))


INDEX = (
    "\n[harness: this command ran without a person's approval and left the git index "
    "'{path}' {why}, which a person's `git checkout -- .` would write; it was removed "
    "(`git reset` makes it again from HEAD).]"
)
PLANTED = (
    "\n[harness: this command ran without a person's approval and left {names}, which "
    "git would take for a submodule's git directory (and run its hooks and "
    "configuration); it was removed. A command a reviewer approves may make one.]"
)
SPOILED = (
    "\n[harness: this command ran without a person's approval and removed or replaced "
    "{names} of the git directory '{path}', after which git would take a directory "
    "inside it for another submodule's; it was put back ({names} as it was before the "
    "command, a directory made again empty). A command a reviewer approves may change it.]"
)
RELINKED = (
    "\n[harness: this command ran without a person's approval and removed or replaced "
    "{names} of the git directory '{path}'; it was put back as the link it was. A "
    "command a reviewer approves may change it.]"
)
INDEX_TOO_LARGE = (
    "\n[harness: this command ran without a person's approval and left the git index "
    "'{path}' at {size} MiB (with its split index's shared parts and, as git makes them "
    "whole, the paths of one of version 4; counted up to the bound), more than Harness still "
    "read after such a command ({limit} MiB left of 64 MiB, or of twice the size of the "
    "workspace's indexes before, for all of them together); it was removed "
    "unread (`git reset` makes it again from HEAD). A command a reviewer approves may "
    "make a larger one.]"
)
# What git's verify_path refuses in a name (here: on any file system), besides `.`, `..`
# and empty parts: `.git` however spelled (case, NTFS's trailing dots and spaces and
# short name, HFS's ignored characters).
_HFS_IGNORED = re.compile("[\u200c-\u200f\u202a-\u202e\u206a-\u206f\ufeff]")


def _bad_index_path(path: str) -> bool:
    """Whether git would refuse `path` in an index (a sparse directory's ends in `/`)."""
    parts = path.removesuffix("/").split("/")
    for part in parts:
        if part in ("", ".", ".."):
            return True
        plain = _HFS_IGNORED.sub("", part).lower().rstrip(". ")
        if plain in (".git", "git~1"):
            return True
    return False


def _object_format(dir_fd: int) -> str:
    """The object format of the git directory `dir_fd` (its configuration's
    extensions.objectformat, sha1 without one). For the guarded git directories, at most
    MAX_DIRECTORIES: not counted in a run's MAX_CONFIG_READS."""
    result = Guard()
    try:
        config = _open("config", dir_fd, result)
        if config is None or not stat.S_ISREG(os.fstat(config).st_mode):
            return "sha1"
        pairs = _configuration(_read(config), Path("config"), result)
    except (OSError, ToolError):
        return "sha1"
    finally:
        result.close()
    return _format_of(pairs)


def _format_of(pairs: list[tuple[str, str]]) -> str:
    return dict(pairs).get("extensions.objectformat", "sha1").strip().lower()


# How the guard opens an index (and a split index's shared part) to hand to git: never
# followed, and without waiting (an unapproved `mkfifo .git/index` held the worker
# forever in open(2), in the workspace's lock, with no writer left in the sandbox).
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _bad_index(dir_fd: int, object_format: str) -> str | None:
    """Why the `index` in the git directory `dir_fd` is not one git itself writes (a name
    git refuses, in its entries, a split index's shared part or its resolve-undo record;
    not a regular file; not readable), or None. Read by git itself, in an empty
    repository of its own, with the files (never followed) handed over as descriptors."""
    held: list[int] = []
    try:
        try:
            index = os.open("index", _READ_FLAGS, dir_fd=dir_fd)
        except OSError as error:
            return f"unreadable ({error.strerror or error})"
        held.append(index)
        if not stat.S_ISREG(os.fstat(index).st_mode):
            return "not a regular file"
        with tempfile.TemporaryDirectory(prefix="harness-index-") as scratch:
            git_dir = os.path.join(scratch, "g")
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_NOSYSTEM": "1"}
            env |= {"HOME": "/nonexistent", "GIT_CONFIG_GLOBAL": "/dev/null", "LC_ALL": "C"}
            if object_format not in ("sha1", "sha256"):
                return f"of an object format git does not know ({object_format!r})"
            made = subprocess.run(
                ["git", "init", "-q", "--bare", f"--object-format={object_format}", git_dir],
                capture_output=True,
                env=env,
                timeout=30,
                check=False,
            )
            if made.returncode != 0:
                return "unreadable (no scratch repository)"
            for name in _names(dir_fd):  # a split index's shared part
                if name.startswith("sharedindex."):
                    try:
                        shared = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
                    except OSError:
                        continue
                    held.append(shared)
                    if not stat.S_ISREG(os.fstat(shared).st_mode):
                        return f"with a split index part {name!r} that is not a regular file"
                    os.symlink(f"/proc/self/fd/{shared}", os.path.join(git_dir, name))
            env["GIT_INDEX_FILE"] = f"/proc/self/fd/{index}"
            for listing in (["--stage", "--sparse"], ["--resolve-undo"]):
                try:
                    done = subprocess.run(
                        # (on one thread: read as `_packed_paths` counts it, from the
                        # first entry on, whatever blocks an extension names)
                        ["git", "-c", "index.threads=1", f"--git-dir={git_dir}"]
                        + ["ls-files", "-z", *listing],
                        capture_output=True,
                        cwd=scratch,
                        env=env,
                        timeout=120,
                        check=False,
                        pass_fds=held,
                    )
                except (OSError, subprocess.TimeoutExpired) as error:
                    return f"unreadable ({error})"
                if done.returncode != 0:
                    return "unreadable by git"
                for item in done.stdout.split(b"\0"):
                    if not item:
                        continue
                    path = item.split(b"\t", 1)[-1].decode("utf-8", "surrogateescape")
                    if _bad_index_path(path):
                        return f"naming {path!r}"
    finally:
        for fd in held:
            os.close(fd)
    return None


# What `git init`, `clone`, `add`, `commit`, `fetch`, `merge` ... make in a git directory
# (a new one is judged against it: `_judge_made`), and the configuration keys they set.
MADE_NAMES = frozenset(
    {
        *("HEAD", "config", "description", "index", "packed-refs", "shallow", "FETCH_HEAD"),
        *("objects", "refs", "logs", "info", "hooks", "branches", "rr-cache", "lfs"),
        *("COMMIT_EDITMSG", "ORIG_HEAD", "MERGE_HEAD", "MERGE_MSG", "MERGE_MODE", "MERGE_RR"),
        *("AUTO_MERGE", "REBASE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD", "SQUASH_MSG"),
        *("TAG_EDITMSG", "BISECT_LOG", "BISECT_START", "BISECT_TERMS", "BISECT_NAMES"),
        *("BISECT_EXPECTED_REV", "BISECT_ANCESTORS_OK", "BISECT_HEAD", "gitk.cache"),
        *("index.lock", "HEAD.lock", "config.lock", "packed-refs.lock", "gc.pid", "gc.log"),
        "reftable",
    }
)
_MADE_DIRECTORIES = frozenset({"objects", "refs", "logs", "info", "hooks", "branches"})
# (Not a partial clone's `extensions.partialClone`, `remote.*.promisor` or its filter:
# a promisor remote is fetched from for a missing object by a person's `git log -p`,
# `diff` or `checkout`, unasked; with `http://host/<what the command read>` as its URL,
# a command with no network had the person's `git log -p` send it. A sandbox with no
# network makes no partial clone but of a local path, rarely.)
_MADE_KEYS = re.compile(
    r"core\.(repositoryformatversion|filemode|bare|logallrefupdates|ignorecase"
    r"|precomposeunicode|symlinks)|extensions\.(objectformat|refstorage)"
    r"|core\.(autocrlf|eol|safecrlf|quotepath|sparsecheckout|sparsecheckoutcone)"
    r"|index\.sparse|init\.defaultbranch|user\.(name|email)"
    r"|remote\..*\.(url|pushurl|fetch|tagopt|mirror)"
    r"|branch\..*\.(remote|merge|rebase)|submodule\..*\.(url|active)"
    r"|pull\.(rebase|ff)|push\.(default|autosetupremote)|fetch\.prune|merge\.ff"
    r"|(commit|tag)\.gpgsign|color\.ui",
    re.DOTALL,
)


def _remove_made_repositories(result: Guard) -> None:
    """Each `.git` in the workspace (at any depth) that was not there before the run and
    would make git run programs (`_judge_made`) is removed, and `result.notes` says why:
    a command no person approved made it (`git init` and `.git/config` with
    core.fsmonitor, `sub/.git/hooks/pre-commit`), and a person's git there would run
    it; and each directory the same walk finds that git takes for a git directory by its
    own names and was none before is judged (`_defuse_bare`). ToolError when the
    workspace cannot be searched or one cannot be removed (after all were judged)."""
    if result.known is None or result.root is None or result.workspace is None:
        return
    unread: list[str] = []  # (past MAX_CONFIG_READS)
    untold: list[str] = []  # (removed past MADE_NOTES notes)
    failures = _Failures()
    bare: list[tuple[str, tuple[int, int]]] = []
    fifos: list[str] = []
    found = _git_entries(result.root, MAX_WALK_AFTER, before=False, bare=bare, fifos=fifos)
    with failures.step():
        _remove_fifos(result.root, fifos, result)
    defused: list[str] = []
    for path, identity in bare:
        if identity not in result.known_bare:
            with failures.step():
                why = _defuse_bare(path, result)
                if why is not None and len(defused) < MADE_NOTES:
                    result.notes.append(BARE.format(path=path or ".", why=why))
                defused += [path or "."] if why is not None else []
    if len(defused) > MADE_NOTES:
        rest = defused[MADE_NOTES:]
        result.notes.append(BARE_MORE.format(count=len(rest), names=_some(rest)))
    for path, identity, _ in found:
        if identity in result.known:
            continue  # one that was there (bound: moved along with its directory at most)
        with failures.step():
            why = _remove_made_repository(path, result)
            if why == _UNREAD:
                unread.append(path)
            elif why is None:
                pass
            elif len(untold) or _told(result) >= MADE_NOTES:
                untold.append(path)
            else:
                result.notes.append(MADE.format(path=path, why=why))
    if untold:
        result.notes.append(MADE_MORE.format(count=len(untold), names=_some(untold)))
    if unread:
        result.notes.append(MADE_MANY.format(count=len(unread), names=_some(unread)))
    failures.raise_any()


FIFOS = (
    "\n[harness: this command ran without a person's approval and left {names} in the "
    "workspace as a FIFO, which a person's git opens by name and waits on for good (a "
    "`.gitignore`, `.gitattributes` or `.mailmap` one hung their `git status` or `git "
    "log`; so did a loose object in a directory `objects/info/alternates` names); it was "
    "removed. Make a FIFO the command needs again in the command that uses it, or outside "
    "the workspace (`/tmp`).]"
)


def _remove_fifos(root: int, fifos: list[str], result: Guard) -> None:
    """Remove each FIFO (or device) the walk after an unapproved run met in the work
    tree (`fifos`, relative to the workspace `root`), whenever made: git opens a file
    there by name with no O_NONBLOCK, and a FIFO holds it until a writer comes. Each
    `.gitignore` and `.gitattributes` at any depth and `.mailmap` (`git status`, `git
    diff`, `git log --format=%aN`), and a loose object in a directory of the work tree
    that `objects/info/alternates` names (the run removed it from `.git/objects`: `git
    log -p`) hung the person's git, checked with git 2.39; a global `core.excludesFile`
    or `commit.template` of theirs may name any other file. By name only would miss the
    last two; what it costs is a FIFO an agent left for its next command (rare: a FIFO
    is made and used in one), which it makes again. A tracked file made a FIFO does not
    hang git (it takes it for a change of type, `lstat` first). git makes none."""
    removed = [path for path in fifos if _remove_at(root, path, ".")]
    if removed:
        result.notes.append(FIFOS.format(names=_some(removed)))


BARE = (
    "\n[harness: this command ran without a person's approval and made '{path}' a git "
    "directory to git (a bare repository: HEAD, objects/ and refs/), which {why}: a "
    "person's git run in it (or below it) would run programs from it, so its HEAD was "
    "removed and git no longer takes it for a git directory. `git init --bare` makes "
    "none of that; a command a reviewer approves may.]"
)


BARE_MORE = (
    "\n[harness: this command ran without a person's approval and made {count} more "
    "directories git directories to git ({names}) that would make git run programs, as "
    "above; their HEAD was removed.]"
)


def _defuse_bare(path: str, result: Guard) -> str | None:
    """The directory at `path` (relative to the workspace; `` for the workspace itself)
    that git takes for a git directory by its own names, which was none before the run
    (`git init --bare x`, HEAD, objects/ and refs/ made by hand, or added to a directory
    of the project): when it holds more than `git init --bare` makes that git reads
    (`_judge_bare`), its HEAD is removed, so that no git takes it for a git directory,
    and the model is told. Its other files are left: they may be the project's. Before,
    `git init --bare x && git -C x config core.pager ...` (or a hook) ran at a person's
    `git log` (`git branch`, `git fetch`) in `x`. Why its HEAD was removed, or None."""
    assert result.root is not None and result.workspace is not None
    shown = path or "."
    try:
        fd = _open_path(result.root, path.split("/") if path else [])
    except OSError as error:
        raise ToolError(
            f"The command ran without a person's approval and made '{shown}' a git "
            f"directory to git, which could not be checked ({error.strerror or error}). "
            "Do not run git in it; an operator must look at it."
        ) from None
    try:
        why = _judge_bare(fd, result.workspace / path, result)
        if why is not None and _remove(fd, "HEAD", f"{shown}/HEAD", directories_only=False):
            return why
        return None
    finally:
        os.close(fd)


def _judge_bare(dir_fd: int, where: Path, run: Guard) -> str | None:
    """Why the directory `dir_fd` that git takes for a git directory would make git run
    programs, or None when what git reads of it is what `git init --bare` makes (a
    configuration of `_MADE_KEYS` alone, hooks that are `*.sample`, `info/exclude`, an
    empty `branches/`: a file there or in `remotes/` is a remote's URL, which may name
    a repository hidden inside a `.git`, whose hooks a push runs).
    Fail closed: a configuration, `hooks` or `info` that is not what git makes there, a
    `commondir` (another directory's configuration), `config.worktree`, `modules`,
    `worktrees`. Names git does not read there (the project's files) are not judged."""
    held = Guard()
    later: list[str] = []
    try:
        for name in sorted(_names(dir_fd)):
            if name in ("commondir", "config.worktree", "modules", "worktrees"):
                return f"holds '{name}'"
            info = _lstat(dir_fd, name)
            if info is not None and stat.S_ISLNK(info.st_mode) and name in MADE_NAMES:
                # (git writes through one: `FETCH_HEAD`, `logs` ...)
                return f"holds '{name}', a symbolic link"
            if info is not None and _blocks(info.st_mode) and name in MADE_NAMES:
                # (git waits on one: a FIFO at HEAD hung the person's `git status` in it)
                return f"holds '{name}', a FIFO"
            if name in ("logs", "refs", "objects"):
                later.append(name)
            if name not in ("config", "hooks", "info", "remotes", "branches"):
                continue
            entry = _open(name, dir_fd, held)
            if entry is None:
                continue
            mode = os.fstat(entry).st_mode
            expected = stat.S_ISREG if name == "config" else stat.S_ISDIR
            if not expected(mode):
                return f"holds '{name}', which is not what git makes there"
            why, _ = _judge_git_made(name, entry, where, run)
            if why is not None:
                return why
        for name in later:  # (after what git reads there: each walks all it holds)
            hidden = _hand_built_in(dir_fd, name)
            if hidden is not None:
                return f"holds {hidden}"
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    finally:
        held.close()
    return None


def _judge_git_made(
    name: str, entry: int, where: Path, run: Guard
) -> tuple[str | None, list[tuple[str, str]]]:
    """Why `name` in a git directory (open as `entry`, of the kind git makes there) is
    not what git itself makes, for the entries a bare repository (`_judge_bare`) and a
    made `.git` (`_judge_made`) share: hooks that are `*.sample` only, `info/exclude`
    only, `branches/` and `remotes/` empty (a file there is a remote's URL, which may
    name a repository hidden inside a `.git`, whose hooks a push runs), a configuration
    of `_MADE_KEYS` alone (its pairs returned, with None). (None, []) for other names."""
    if name == "hooks":
        for hook in sorted(_names(entry)):
            if not (_regular(entry, hook) and hook.endswith(".sample")):
                return f"holds the hook 'hooks/{hook}'", []
    elif name == "info":
        for item in sorted(_names(entry)):
            if not (_regular(entry, item) and item == "exclude"):
                return f"holds 'info/{item}'", []
    elif name in ("remotes", "branches"):
        for item in sorted(_names(entry)):
            return f"holds '{name}/{item}'", []
    elif name == "config":
        try:
            pairs = _configuration(_read(entry), where / "config", run)
        except ConfigBudgetSpent:
            return _UNREAD, []
        except ToolError:
            return "has a configuration that cannot be read", []
        for key, value in pairs:
            if not _MADE_KEYS.fullmatch(key):
                return f"sets {key} = {value!r} in its configuration", []
        return None, pairs
    return None, []


def _remove_made_repository(path: str, result: Guard) -> str | None:
    """Remove the `.git` at `path` the command made when it would make git run programs
    (`_judge_made`); why it was removed, or None when it is kept."""
    assert result.root is not None and result.workspace is not None
    try:
        parent = _open_path(result.root, path.split("/")[:-1])
    except OSError as error:
        raise ToolError(
            f"The command ran without a person's approval and made the git directory "
            f"'{path}', which could not be checked ({error.strerror or error}). Do not "
            "run git in this workspace; an operator must remove it."
        ) from None
    try:
        why = _judge_made(parent, result.workspace / path, result)
        if why is not None and _remove(parent, ".git", path, directories_only=False):
            return why
        return None
    finally:
        os.close(parent)


def _told(result: Guard) -> int:
    """The notes of `.git` entries removed one by one (MADE) so far."""
    return sum(note.startswith(MADE.split("{", 1)[0]) for note in result.notes)


def _some(paths: list[str]) -> str:
    """The first MADE_NOTES of `paths`, quoted, and how many more."""
    shown = ", ".join(f"'{path}'" for path in paths[:MADE_NOTES])
    left = len(paths) - MADE_NOTES
    return shown + (f" and {left} more" if left > 0 else "")


def _regular(dir_fd: int, name: str) -> bool:
    """Whether `name` in `dir_fd` is a regular file (not followed)."""
    return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)


def _open_path(root: int, parts: list[str]) -> int:
    """The directory `parts` under `root` (an O_PATH descriptor, opened one name at a time
    with no link followed); the caller closes it."""
    fd = os.open(".", _PATH, dir_fd=root)
    try:
        for part in parts:
            child = os.open(part, _PATH | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


# Why a `.git` the command made is removed past the run's bound on configurations read.
_UNREAD = (
    f"has a configuration Harness did not read: the command made more git directories "
    f"than Harness checks after a command no person approved ({MAX_CONFIG_READS} "
    f"configurations, or {CONFIG_READ_SECONDS:.0f} s of reading them)"
)


def _judge_made(parent: int, where: Path, run: Guard) -> str | None:
    """Why the `.git` in `parent`, made by a command no person approved, would make git
    run programs, or None for what git itself makes (`MADE_NAMES`, a configuration of
    `_MADE_KEYS` alone, hooks that are git's `*.sample`, `info/exclude`). Fail closed:
    whatever else is there. Its index is read within what is left of `run`'s
    `index_budget`."""
    result = Guard()
    object_format = "sha1"
    try:
        git = _open(".git", parent, result)
        if git is None:
            return None
        kind = os.fstat(git).st_mode
        if stat.S_ISLNK(kind):
            return "is a symbolic link"
        if not stat.S_ISDIR(kind):
            return "is a '.git' file naming a git directory elsewhere"
        for name in sorted(_names(git)):
            if name not in MADE_NAMES:
                return f"holds '{name}'"
            entry = _open(name, git, result)
            if entry is None:
                continue
            mode = os.fstat(entry).st_mode
            expected = stat.S_ISDIR if name in _MADE_DIRECTORIES else stat.S_ISREG
            if name in ("lfs", "rr-cache", "reftable"):
                expected = stat.S_ISDIR
            if not expected(mode):
                return f"holds '{name}', which is not what git makes there"
            why, pairs = _judge_git_made(name, entry, where, run)
            if why is not None:
                return why
            if name == "config":
                object_format = _format_of(pairs)
            elif name == "index":
                left = run.index_budget
                # (its configuration, read above: `config` sorts before `index`)
                if not _take_index_budget(run, _index_cost(git, object_format, left)):
                    return (  # not read
                        f"holds an index larger than {left >> 20} MiB, not read (what is "
                        "left of what Harness reads of indexes after such a command)"
                    )
                bad = _bad_index(git, object_format)
                if bad is not None:
                    return f"holds an index {bad}"
            if name in _MADE_DIRECTORIES | {"lfs", "rr-cache", "reftable"}:
                # (a git directory hidden in its own, where no walk looks, which its
                # `remote.origin.url = ../.git/objects/xx` names: `_remove_hidden_...`)
                hidden = _hand_built_in(git, name)
                if hidden is not None:
                    return f"holds {hidden}"
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    finally:
        result.close()
    return None


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
