"""What git reads from outside the workspace for a command run in it: the part of a
preview's fingerprint (`preview.fingerprint_of`) the workspace's own walk cannot see
(docs/security.md, "Git metadata in the sandbox").

A previewed command's effect is applied only while everything that could change it is as
it was; git run in the workspace reads configuration, hooks and refs outside it (the
host's `/etc/gitconfig`, the main repository of a linked worktree, the repository above
a fixed workspace, an included team file), and runs programs a configuration names
outside it (`filter.x.clean = /team/bin/clean`). `outside_state` describes all of them,
bounded (MAX_OUTSIDE), as one text the fingerprint's digest takes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pwd
import re
import stat
import subprocess
from pathlib import Path

from dispatcher.tools import sandbox, sandbox_git
from dispatcher.tools.base import ToolError
from dispatcher.tools.sandbox_git import (
    _COMMAND_KEYS,
    _PATH,
    FILES,
    Guard,
    _configuration,
    _expand_home,
    _gitdir_of,
    _inside,
    _read,
    _resolve,
    _sandbox_uid,
)

# What a configuration must say for `outside_state` to read its settings (one git
# subprocess, `_names_files`): a key naming a file or directory git reads; or one of the
# keys whose value git runs (_COMMAND_KEYS; any of an [alias] or [pager] section) with a
# value that may name a file outside the workspace: an absolute path or `~user/` (a
# relative one only with a work tree outside it, the repository's above it). Keys are
# matched at the start of a line or after a section's header (`[core] fsmonitor = ...`),
# after what git skips there (config.c's isspace: a space, a tab, a carriage return:
# `\rpath = /team/x` is an include, whose configuration was once never read);
# section and key names hold no escapes or line continuations, a value may (`\` at a
# line's end: read). A name matched that is no such key costs a read, no more: a
# repository's `credential.helper = gcloud.sh` or git-lfs's filter (`git-lfs clean --
# %f`) costs none.
_POINTER_KEY = re.compile(
    rb"(^|\])[ \t\r]*(path|hookspath|attributesfile|excludesfile|file|orderfile"
    rb"|ignorerevsfile|signaturefile|allowedsignersfile|revocationfile|skiplist|template"
    rb"|signingkey|aliasesfile|worktree|templatedir)[ \t]*([=;#\r\n]|$)",
    re.IGNORECASE | re.MULTILINE,
)
# Keys naming a file git reads (besides configurations, attributes and excludes), each
# described by its content when it lies outside the workspace: `mailmap.file =
# /team/mailmap` gives `git shortlog` its names; a signing key, a skip list, an order
# file, a template ... Before, none was read (the configuration naming one was not even
# parsed), and the team's mailmap changed after the approval had the old effect applied.
_READ_FILE_KEYS = frozenset(
    {
        "mailmap.file",
        "diff.orderfile",
        "blame.ignorerevsfile",
        "format.signaturefile",
        "gpg.ssh.allowedsignersfile",
        "gpg.ssh.revocationfile",
        "fsck.skiplist",
        "fetch.fsck.skiplist",
        "receive.fsck.skiplist",
        "commit.template",
        "user.signingkey",
        "sendemail.aliasesfile",
    }
)
_COMMAND_NAMES = (
    rb"fsmonitor|pager|editor|sshcommand|askpass|gitproxy|alternaterefscommand|external"
    rb"|difffilter|browser|program|defaultkeycommand|helper|clean|smudge|process|textconv"
    rb"|command|driver|cmd|tunnel|httpd|packobjectshook|uploadpack|receivepack|vcs|update"
    rb"|smtpserver|sendmailcmd|tocmd|cccmd|headercmd|tool|guitool"
)
_COMMAND_SECTION = re.compile(rb"\[[ \t]*(alias|pager)[ \t]*[\].\"]", re.IGNORECASE)
_COMMAND_KEY = re.compile(
    rb"(^|\])[ \t\r]*(" + _COMMAND_NAMES + rb")[ \t]*([=;#\r\n]|$)",
    re.IGNORECASE | re.MULTILINE,
)
_COMMAND_PATH = re.compile(
    rb"(^|\])[ \t\r]*(" + _COMMAND_NAMES + rb")[ \t]*=[^\n]*[/~]|\\\r?\n",
    re.IGNORECASE | re.MULTILINE,
)
# ... and one whose value `_unread_command` may not read whole: a character of the shell's
# syntax (`=` too: `PATH=/team/bin x`), or the program `env`.
_COMMAND_UNPLAIN = re.compile(
    rb"(^|\])[ \t\r]*(" + _COMMAND_NAMES + rb")[ \t]*="
    rb"([^\n]*[^A-Za-z0-9_%,:+@./ \t\r\n-]|[ \t!]*(\S*/)?env([ \t\r]|$))",
    re.IGNORECASE | re.MULTILINE,
)
# Files and directories outside the workspace described for one fingerprint; past it, the
# rest is counted (the same count: the same fingerprint), and git configurations parsed
# (for their includes and hooks directories) are bounded as a guard's are.
MAX_OUTSIDE = 256
MAX_LISTED = 1000  # entries of one hooks or info directory described
_PARTIAL = "\0partial\n"  # (the end of a directory's line that lists it in part)
MAX_NAMED = 256  # files command lines name described; past it, counted
# Directories of refs and reflogs described for one fingerprint (`_ref_trees`), a budget of
# their own (a repository's thousands of branch directories never crowd out its
# configuration); past it, counted.
MAX_REF_DIRS = 256
# ... and of the workspace's own repository, scanned for the links among them alone (the
# workspace's walk describes each entry): a budget of their own too. Before, they shared
# MAX_REF_DIRS, and a repository of the workspace with 257 directories of refs and
# reflogs (128 namespaces of remote branches, `origin/<user>/<topic>`, and their reflogs)
# made every git preview not appliable, though nothing of them lay outside it. Before
# too, the directories outside took room in MAX_OUTSIDE: 240 of them had the main
# repository's configuration left undescribed, a gap.
MAX_INSIDE_REF_DIRS = 20_000
# A pseudo-ref's name (refs.c is_pseudo_ref / is_root_ref's syntax): the top of a git
# directory, ORIG_HEAD, FETCH_HEAD, MERGE_HEAD ... (never `index` or `config`).
_PSEUDO_REF = re.compile(r"[A-Z_-]+")
# Refs git reads to resolve one name (HEAD, and each symbolic ref it names in turn):
# refs.h's SYMREF_MAXDEPTH; past it git resolves nothing.
SYMREF_MAXDEPTH = 5
# A ref name as git takes it (check_refname_format, one level allowed): components with
# none of git's forbidden characters, none starting with `.` or ending with `.lock`.
_REF_COMPONENT = re.compile(r"[^\x00-\x20\x7f ~^:?*\[\\/.][^\x00-\x20\x7f ~^:?*\[\\/]*")
# A command line of a command-valued key cut into simple commands and their words (as a
# shell would, near enough to find the paths it names).
_COMMAND_SEPARATORS = re.compile(r"[;&|()\n`]+")
_WORD_SEPARATORS = re.compile(r"""[\s'"<>{}]+""")
# A word's start a sandboxed shell expands to a directory Harness knows: `~/`, `$HOME/`
# (sandbox.HOME), `$PWD/` (the work tree git runs the command in). ({} are word
# separators above: `${HOME}/x` reads `$HOME`, `/x`.)
_HOME_WORD = re.compile(r"(~|\$HOME)(?=/|$)")
_PWD_WORD = re.compile(r"\$PWD(?=/|$)")
_BRACED_OR_QUOTED = re.compile(r"""\$\{(HOME|PWD)\}|["'](\$HOME|\$PWD)["']""")


def outside_state(workspace: Path, base: Path, dot_gits: list[str]) -> str:
    """`outside_state_and_gaps`'s description alone."""
    return outside_state_and_gaps(workspace, base, dot_gits)[0]


def outside_state_and_gaps(
    workspace: Path, base: Path, dot_gits: list[str]
) -> tuple[str, list[str]]:
    """A description of what git reads from outside `workspace` for a command run in it:
    the host's system configuration (SYSTEM_CONFIG) and the per-user files of whoever
    the sandbox runs as (`~/.gitconfig`, `$XDG_CONFIG_HOME/git/config`: a sandboxed run
    reads neither, its GIT_CONFIG_GLOBAL being /dev/null, but a person's git does); the
    git directory of the repository holding the workspace, and the one each `.git` of
    it names outside it (`dot_gits`, relative paths read under `base`, the workspace as
    held: a linked worktree's, a submodule's), with their `commondir`'s: their `config`
    and `config.worktree`, `hooks/` and `info/`, and the work tree's HEAD, index, `shallow`,
    `packed-refs` and each ref HEAD names in turn (`_ref_chain`); every file a
    configuration includes and hooks directory it names outside the workspace; and every
    file outside it a command-valued key names (`_named_files`: `core.fsmonitor =
    /team/fsmon`, `filter.x.clean = python3 /team/clean.py`). Each file by identity,
    mode, times and the SHA-256 of its content (one of the workspace that is a link to
    a file outside it too: git follows it; a named program by identity, mode and times
    alone: its change time moves with any change), each directory by its entries; what
    is missing or cannot be read says so. What lies in the workspace is the
    fingerprint's walk's (`preview.fingerprint_of`), whose digest takes this too: a
    configuration changed outside it between a preview and its apply (the main
    repository of a linked worktree, an included team file a read-only entry shows)
    changed what the command would do, and the approved effect was applied all the
    same.

    And what the description leaves out (`_OutsideState.gaps`): past a bound (MAX_OUTSIDE
    files and directories, MAX_REF_DIRS directories of refs, MAX_NAMED named files,
    MAX_LISTED entries of a directory), a configuration that could not be read, or a
    command line that is not plain words (`_unread_command`: `!cd /team && sh x.sh`,
    `PATH=/team/bin:$PATH x`), a change may go unseen; a preview whose fingerprint has a
    gap is not applied (`preview.Effect.unwatched`). Before, the part described was
    trusted as the whole, and a change past it had the old effect applied."""
    state = _OutsideState(workspace)
    state.config(str(sandbox_git.SYSTEM_CONFIG), None)
    for home in _sandbox_homes():
        state.config(os.path.join(home, ".gitconfig"), None)
        state.config(os.path.join(home, ".config", "git", "config"), None)
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    if xdg.startswith("/"):
        state.config(os.path.join(xdg, "git", "config"), None)
    for tree, git_dir in _enclosing_git_dir(workspace, state):
        state.trees.append(tree)
        state.git_dir(git_dir, tree)
    for rel in dot_gits:
        found = _dot_git_target(base, workspace, rel)
        if found is not None:
            state.git_dir(found, str(workspace / os.path.dirname(rel)))
    state.run()
    return "".join(state.lines), list(dict.fromkeys(state.gaps))


@dataclasses.dataclass
class _OutsideState:
    """`outside_state`'s work: the configurations still to read (their path and the work
    tree a relative core.hooksPath of theirs is taken from), what was described, the work
    trees outside the workspace (the repository's above it: where a configuration that
    is no repository's own runs a relative program)."""

    workspace: Path
    queue: list[tuple[str, str | None]] = dataclasses.field(default_factory=list)
    seen: set[str] = dataclasses.field(default_factory=set)
    lines: list[str] = dataclasses.field(default_factory=list)
    budget: Guard = dataclasses.field(default_factory=Guard)
    trees: list[str] = dataclasses.field(default_factory=list)
    named_files: int = 0
    ref_dirs: int = 0
    inside_ref_dirs: int = 0  # (the workspace's: for the links among them)
    ref_walked: set[str] = dataclasses.field(default_factory=set)
    # What the description leaves out, said for the reviewer (see outside_state_and_gaps)
    gaps: list[str] = dataclasses.field(default_factory=list)

    def config(self, path: str, tree: str | None) -> None:
        self.queue.append((os.path.normpath(path), tree))

    def git_dir(self, git_dir: str, tree: str) -> None:
        """The configuration and hooks of the git directory `git_dir` and of its
        `commondir`: described where they lie outside the workspace, the configurations
        read wherever they lie (one of the workspace may include a file outside it). And
        the work tree's state git reads there (`_git_state`)."""
        common = self._common(git_dir)
        for where in (git_dir, common):
            if where is None:
                continue
            for name in FILES[:2]:
                self.config(os.path.join(where, name), tree)
            self.directory(os.path.join(where, "hooks"))
            self.directory(os.path.join(where, "info"))
        self._git_state(git_dir, common)

    def _git_state(self, git_dir: str, common: str | None) -> None:
        """A work tree's state as git reads it from its git directory: HEAD, the index,
        `packed-refs`, `shallow` and the refs HEAD names (a linked worktree's lie outside the
        workspace: a commit made to its branch there after a preview of `git log -1 >
        last.txt` left the fingerprint as it was, and the old effect was applied)."""
        self.file(os.path.join(git_dir, "index"))
        for where in dict.fromkeys((git_dir, common or git_dir)):
            self.file(os.path.join(where, "packed-refs"))
        # (the history's shallow boundary: `git rev-list --count HEAD` reads it)
        self.file(os.path.join(common or git_dir, "shallow"))
        self._ref_chain(git_dir, common or git_dir)
        self._ref_trees(git_dir, common or git_dir)

    def _ref_trees(self, git_dir: str, common: str) -> None:
        """Every ref and reflog git may read besides HEAD's chain, by directory: the
        pseudo-refs at the top of the work tree's git directory and the common one
        (ORIG_HEAD, FETCH_HEAD; `main-worktree/ORIG_HEAD`), and each directory of their
        `refs/` and `logs/` and of the other work trees' (`worktrees/<id>/HEAD`), each
        entry by identity, size and times (a ref is replaced by a rename, a reflog grows,
        and the directory's own times move with any entry added or removed). Before, a
        command reading another branch, a tag or a reflog (`git tag --points-at HEAD >
        TAGS`) had its old effect applied after the tag moved outside the workspace.
        At most MAX_REF_DIRS directories, past it counted."""
        for where in dict.fromkeys((git_dir, common)):
            path = os.path.normpath(where)
            if path not in self.seen and not _inside(self.workspace, path):
                self.lines.append(self._listed(_pseudo_refs_state(path)))
            for link in _pseudo_ref_links(path):
                self._linked_ref(link)
            for name in ("refs", "logs", "worktrees") if where == common else ("refs", "logs"):
                self._ref_tree(os.path.join(where, name))

    def _ref_tree(self, root: str) -> None:
        """Describe the directory `root` and those below it (no link followed), within
        MAX_REF_DIRS (those of the workspace, whose walk describes them, within
        MAX_INSIDE_REF_DIRS), and what each link among their entries leads to
        (`_linked_ref`)."""
        pending = [os.path.normpath(root)]
        while pending:
            path = pending.pop()
            if path in self.ref_walked:
                continue
            self.ref_walked.add(path)
            inside = _inside(self.workspace, path)
            if inside:
                # (a directory of the workspace's reached through a link, `.git/refs ->
                # /team/refs`, is what the link leads to: the workspace's walk takes the
                # link alone, and scanned by its path here nothing under it was described)
                resolved = _resolve(path)
                if resolved is None:
                    self.lines.append(f"{path}\0unresolved\n")
                    continue
                if resolved != path:
                    pending.append(resolved)
                    continue
            if inside:
                self.inside_ref_dirs += 1
            else:
                self.ref_dirs += 1
            if self.ref_dirs > MAX_REF_DIRS or self.inside_ref_dirs > MAX_INSIDE_REF_DIRS:
                self.lines.append("more refs\n")
                self.gaps.append(
                    f"the repository has more than {MAX_REF_DIRS} directories of refs and "
                    "reflogs outside the workspace (or "
                    f"{MAX_INSIDE_REF_DIRS} in it), past which Harness does not watch them"
                )
                return
            # (ref_walked, never `seen`: described once, and never the room of the
            # configurations and hooks `_room` counts)
            if not inside:
                self.lines.append(self._listed(_directory_state(path)))
            try:
                with os.scandir(path) as scanned:
                    entries = sorted(scanned, key=lambda entry: entry.name, reverse=True)
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                    elif entry.is_symlink():
                        pending += self._linked_ref(entry.path)
            except OSError:
                continue  # (described as what it is instead)

    def _linked_ref(self, path: str) -> list[str]:
        """What the link `path` among the refs leads to, as git reads a loose ref through
        it (files_read_raw_ref, the loose refs' listing): a file described by its content
        (`file`: where it lies outside the workspace), a directory returned to be walked;
        nothing for a symbolic ref (a target `refs/...`, read by its name: in the tree).
        Before, a link was described by itself alone, and the workspace's own refs not at
        all (its walk takes a link as a link): `refs/tags/v1 -> /team/v1` is the tag
        /team/v1 holds, which moved with no entry of a repository changed."""
        try:
            target = os.readlink(path)
        except OSError:
            return []
        if target.startswith("refs/") and _ref_name(target):
            return []
        resolved = _resolve(path)
        if resolved is not None and os.path.isdir(resolved):
            return [resolved]
        self.file(path)
        return []

    def _ref_chain(self, git_dir: str, common: str) -> None:
        """HEAD and each ref it names in turn, as git resolves it (refs_resolve_ref_unsafe:
        SYMREF_MAXDEPTH reads): a symbolic ref (`ref: refs/heads/a`, or a link whose
        target starts with `refs/`) may name another (`git symbolic-ref refs/heads/a
        refs/heads/b`). Before, only the ref HEAD names was described: a commit to `b`
        between a preview and its apply left the fingerprint as it was. A ref with no
        loose file is read from `packed-refs` (described by `_git_state`)."""
        name = "HEAD"
        for _ in range(SYMREF_MAXDEPTH):
            path = _ref_path(git_dir, common, name)
            if path is None:
                return
            named = self._symbolic_ref(path)
            if named is None:
                return
            name = named

    def _symbolic_ref(self, path: str) -> str | None:
        """The ref the loose ref at `path` names when it is a symbolic one, described
        (as files_read_raw_ref reads it: a link to `refs/...` is one by its target, any
        other link is followed); None when it is not."""
        try:
            target = os.readlink(path)
        except OSError:
            target = None
        if target is not None and target.startswith("refs/") and _ref_name(target):
            if self._room(os.path.normpath(path)):
                self.lines.append(f"{os.path.normpath(path)}\0link {target}\n")
            return target
        data = self.file(path)
        if data is None or not data.startswith(b"ref:"):
            return None
        return data.removeprefix(b"ref:").strip().decode("utf-8", "replace")

    def _common(self, git_dir: str) -> str | None:
        common = self.file(os.path.join(git_dir, "commondir"))
        if not common or not common.strip():
            return None
        return os.path.join(git_dir, common.decode("utf-8", "replace").strip())

    def run(self) -> None:
        done: set[str] = set()
        while self.queue:
            path, tree = self.queue.pop(0)
            if path in done:
                continue  # (a file including itself, or one another includes too)
            done.add(path)
            data = self.file(path)
            if data is None and os.path.isfile(path):
                # (larger than 1 MiB, or not readable: what it includes is not known)
                self.gaps.append(
                    f"Harness could not read the git configuration {path} (what it includes "
                    "or runs is not watched)"
                )
                continue
            if data is None or not _names_files(data, bool(self.trees)):
                continue
            try:
                pairs = _configuration(data, Path(path), self.budget)
            except ToolError:
                self.lines.append(f"{path}\0unparsed\n")
                self.gaps.append(
                    f"Harness could not read the git configuration {path} (what it includes "
                    "or runs is not watched)"
                )
                continue
            for key, value in pairs:
                self.pointer(path, tree, key, value)

    def pointer(self, path: str, tree: str | None, key: str, value: str) -> None:
        """Queue the file `key = value` of the configuration at `path` includes, or
        describe the hooks directory, attributes or excludes file it names (each as git
        finds it; a relative attributes or excludes file is the work tree's), or the
        files a command-valued key's command line names (`_named_files`)."""
        if _COMMAND_KEYS.fullmatch(key):
            unread = _unread_command(key, value)
            if unread:
                self.gaps.append(
                    f"the git configuration {path} sets {key} to a command line Harness "
                    f"cannot read whole ({unread}), so a program it runs is not watched"
                )
            trees = [tree] if tree is not None else self.trees
            for named in _named_files(value, trees):
                self.named(named)
            if _PROGRAM_PATH.fullmatch(key):
                self._program_path(value, trees)
            return
        including = key == "include.path" or (
            key.startswith("includeif.") and key.endswith(".path")
        )
        files = key in ("core.attributesfile", "core.excludesfile")
        if key == "core.worktree":
            self._work_tree(path, value)
            return
        if key == "init.templatedir":
            self._templates(value)
            return
        if key in _READ_FILE_KEYS:
            self._read_file(tree, key, value)
            return
        if not (including or files or key == "core.hookspath"):
            return
        # (`~/`: the HOME of whoever runs git, the sandbox's when previewed: empty, but
        # `~/../../team/x.gitconfig` is /team/x.gitconfig, taken for nothing before;
        # `%(prefix)/`: git's own installation's, `_from_prefix`)
        expanded = _expand_home(_HOME_WORD.sub(sandbox.HOME, _from_prefix(value), count=1))
        if expanded is None:
            return
        if including:
            self.config(os.path.join(os.path.dirname(path), expanded), tree)
        elif files and os.path.isabs(expanded):
            self.file(expanded)
        elif not files and (os.path.isabs(expanded) or tree is not None):
            self.directory(os.path.join(tree or "/", expanded))

    def _read_file(self, tree: str | None, key: str, value: str) -> None:
        """Describe the file `key = value` names (a `_READ_FILE_KEYS` one), as git finds
        it (git_config_pathname: `~/`, `~user/`, `%(prefix)/`; a relative one from the
        work tree git runs in, `tree`, or each outside the workspace): by its content
        where it lies outside the workspace (`file`). An ssh `user.signingKey` may be
        the key itself (`key::...`, `ssh-ed25519 ...`) or a gpg key's id: a file only when
        it names a path (described by `named`: its content is a key)."""
        key_file = key == "user.signingkey"
        if key_file and not value.startswith(("/", "~", "%(prefix)/")):
            return
        expanded = _expand_home(_HOME_WORD.sub(sandbox.HOME, _from_prefix(value), count=1))
        if not expanded:
            return
        if key_file:
            self.named(expanded)
        elif os.path.isabs(expanded):
            self.file(expanded)
        else:
            for where in [tree] if tree is not None else self.trees:
                self.file(os.path.join(where, expanded))

    def _program_path(self, value: str, trees: list[str]) -> None:
        """The program a `_PROGRAM_PATH` key names, its value one path (git's scripts run
        it quoted, "$merge_tool_path", spaces and all; a bare name is found on PATH):
        described by `named` (absolute, or with a slash, from each work tree in `trees`).
        Before, only its words were (`/team/my` and `tools/meld` of `/team/my
        tools/meld`), never the program: changed after the approval, the old effect was
        applied."""
        if os.path.isabs(value):
            self.named(value)
        elif "/" in value:
            for where in trees:
                self.named(os.path.join(where, value))

    def _work_tree(self, path: str, value: str) -> None:
        """`core.worktree` (relative to the git directory holding `path`) naming a
        directory outside the workspace: a work tree of any size, whose files the
        fingerprint cannot take whole, a gap. Before, it was not read: `git status >
        s.txt` in a repository whose work tree is /team/tree had its old effect applied
        after a file there changed. (A submodule's `../../../sub`, in the workspace, is
        the walk's.)"""
        expanded = _expand_home(_HOME_WORD.sub(sandbox.HOME, _from_prefix(value), count=1))
        if not expanded:
            return
        where = os.path.normpath(os.path.join(os.path.dirname(path), expanded))
        if not _inside(self.workspace, where):
            self.gaps.append(
                f"the git configuration {path} sets core.worktree to a directory outside "
                f"the workspace ({where}), whose files Harness does not watch"
            )

    def _templates(self, value: str) -> None:
        """`init.templateDir`, copied whole into each repository `git init` or `git clone`
        makes (its hooks among them): each directory of it described by its entries
        (`directory`: an entry changed in place moves its change time), within
        MAX_OUTSIDE (past it, a gap). Before, it was not read: a template hook changed
        after the approval of `git init sub` had the old one applied."""
        expanded = _expand_home(_HOME_WORD.sub(sandbox.HOME, _from_prefix(value), count=1))
        if not expanded or not os.path.isabs(expanded):
            return  # (relative: from where git runs, the work tree, the walk's)
        pending = [os.path.normpath(expanded)]
        walked = 0
        while pending and walked <= MAX_OUTSIDE:
            where = pending.pop()
            walked += 1
            self.directory(where)
            try:
                with os.scandir(where) as scanned:
                    pending += sorted(
                        entry.path for entry in scanned if entry.is_dir(follow_symlinks=False)
                    )
            except OSError:
                continue  # (described as what it is instead)
        if pending:
            self.gaps.append(
                f"the template directory git copies ({expanded}) holds more than "
                f"{MAX_OUTSIDE} directories, past which Harness does not watch them"
            )

    def _room(self, path: str) -> bool:
        if path in self.seen or _inside(self.workspace, path):
            return False  # (the workspace's own: its walk's)
        self.seen.add(path)
        if len(self.seen) > MAX_OUTSIDE:
            self.lines.append("more\n")
            self.gaps.append(
                f"git reads more than {MAX_OUTSIDE} files and directories outside the "
                "workspace here, past which Harness does not watch them"
            )
            return False
        return True

    def _listed(self, line: str) -> str:
        """`line` (a `_directory_state`), a gap said when it lists the directory in part."""
        if line.endswith(_PARTIAL):
            self.gaps.append(
                f"a directory git reads outside the workspace ({line.partition(chr(0))[0]}) "
                f"holds more than {MAX_LISTED} entries, past which Harness does not watch "
                "them"
            )
        return line

    def file(self, path: str) -> bytes | None:
        """The content of the regular file at `path`, or None; described once when it
        lies outside the workspace, or resolves to a file there (git follows a link:
        `.git/refs/heads/main -> /team/main`, which the walk takes as a link alone)."""
        path = os.path.normpath(path)
        line, data, resolved = _file_state(path)
        if self._room(path) or (resolved not in (None, path) and self._room(str(resolved))):
            self.lines.append(line)
        return data

    def named(self, path: str) -> None:
        """Describe, once, the file at `path` a command line names (its program, or a
        file handed to it) when it lies outside the workspace: by what it resolves to and
        that file's identity, mode, size and times (its change time moves with any change
        of its content), never its content (a program may be large, a file handed to ssh
        a key)."""
        path = os.path.normpath(path)
        if path in self.seen or _inside(self.workspace, path):
            return
        self.seen.add(path)
        self.named_files += 1
        # (a budget of their own: a configuration's many aliases never crowd out the
        # files and directories above)
        if self.named_files > MAX_NAMED:
            self.lines.append("more\n")
            self.gaps.append(
                f"the git configurations name more than {MAX_NAMED} files their command "
                "lines run or read, past which Harness does not watch them"
            )
            return
        self.lines.append(_identity_state(path))

    def directory(self, path: str) -> None:
        """Describe the directory at `path` (a hooks or info directory, a hooks path) by
        its entries where it lies outside the workspace, or resolves there (`.git/hooks ->
        /team/hooks`: the workspace's walk takes the link alone); and each entry of it that
        is a link, by what git reads through it (`file`: `.git/hooks/pre-commit ->
        /team/pre-commit`, `.git/info/exclude -> /team/exclude`). Before, a directory of
        the workspace's git directory was left to its walk, which follows no link: the
        team's hook, or its excludes, changed after the approval, and the old effect of
        `git commit` or `git add -A` was applied. At most MAX_LISTED links followed; more
        is a gap (the directory of the workspace's too: its walk sees the links alone)."""
        path = os.path.normpath(path)
        resolved = _resolve(path)
        if resolved is not None and resolved != path and not _inside(self.workspace, resolved):
            path = resolved
        if self._room(path):
            self.lines.append(self._listed(_directory_state(path)))
        try:
            with os.scandir(path) as scanned:
                links = sorted(entry.path for entry in scanned if entry.is_symlink())
        except OSError:
            return  # (described as what it is instead)
        if len(links) > MAX_LISTED:
            # (said for the workspace's own directory too, which `_listed` never sees)
            self.gaps.append(
                f"a directory git reads ({path}) holds more than {MAX_LISTED} links, past "
                "which Harness does not watch what they lead to"
            )
        for link in links[:MAX_LISTED]:
            self.file(link)


def _names_files(data: bytes, trees: bool) -> bool:
    """Whether the configuration `data` may name a file outside the workspace that the
    fingerprint takes (see _POINTER_KEY), or a command line it may not read whole
    (_COMMAND_UNPLAIN): worth a git process to read it. `trees`: a
    work tree lies outside the workspace (a relative program of its configuration may
    too)."""
    if _POINTER_KEY.search(data):
        return True
    section = _COMMAND_SECTION.search(data)
    if not (section or _COMMAND_KEY.search(data)):
        return False
    # (an alias's or pager's command line, whatever it says: `_unread_command` reads it)
    return (
        trees
        or section is not None
        or _COMMAND_PATH.search(data) is not None
        or (_COMMAND_UNPLAIN.search(data) is not None)
    )


def _from_prefix(value: str) -> str:
    """A path `value` of a configuration as git reads one starting `%(prefix)/`
    (config.c's interpolate_path: system_path): what follows under git's installation
    prefix, or as it is when absolute (`%(prefix)//team/x`). Before, it was taken
    relative to the configuration's directory: `include.path =
    %(prefix)/share/team.gitconfig` was described as a file that is not there."""
    rest = value.removeprefix("%(prefix)/")
    if rest == value or rest.startswith("/"):
        return rest
    return os.path.join(_git_prefix(), rest)


@functools.cache
def _git_prefix() -> str:
    """git's installation prefix (its exec path is `<prefix>/lib/git-core` or
    `<prefix>/libexec/git-core`); `/usr` when git cannot say."""
    try:
        done = subprocess.run(
            ["git", "--exec-path"], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return "/usr"
    return os.path.dirname(os.path.dirname(done.stdout.strip())) or "/usr"


def _ref_name(name: str) -> bool:
    """Whether git takes `name` for a ref's name (check_refname_format, one level
    allowed); a name it refuses stops its resolution, and names no file here."""
    parts = name.split("/")
    return (
        all(
            _REF_COMPONENT.fullmatch(part) and not part.endswith(".lock") and ".." not in part
            for part in parts
        )
        and "@{" not in name
        and name != "@"
    )


def _per_worktree(name: str) -> bool:
    """Whether git keeps the ref `name` in each work tree's own git directory
    (is_current_worktree_ref: HEAD and other pseudo-refs, refs/worktree/, refs/bisect/,
    refs/rewritten/)."""
    return bool(re.fullmatch(r"[A-Z_-]+", name)) or name.startswith(
        ("refs/worktree/", "refs/bisect/", "refs/rewritten/")
    )


def _ref_path(git_dir: str, common: str, name: str) -> str | None:
    """Where git looks for the loose ref `name` of the work tree whose git directory is
    `git_dir` (files_ref_path): its own for a per-worktree ref, another work tree's for
    `worktrees/<id>/...`, the main one's for `main-worktree/...`, else the common
    directory's; None for a name git refuses."""
    if not _ref_name(name):
        return None
    if name.startswith("worktrees/"):
        worktree, _, bare = name.removeprefix("worktrees/").partition("/")
        if bare and _per_worktree(bare):
            return os.path.join(common, "worktrees", worktree, bare)
    if name.startswith("main-worktree/") and _per_worktree(name.removeprefix("main-worktree/")):
        return os.path.join(common, name.removeprefix("main-worktree/"))
    return os.path.join(git_dir if _per_worktree(name) else common, name)


def _named_files(value: str, trees: list[str]) -> list[str]:
    """The files a command line git runs (a command-valued key's `value`) names: each
    absolute word (`/team/bin/clean`, `--file=/team/x`, `~user/bin/x`), and, taken from
    each work tree in `trees` (where git runs it), each relative program (`tools/x`) and
    argument (`sh clean.sh`), and each word a sandboxed shell starts at a directory
    Harness knows: `~/...` and `$HOME/...` at the sandbox's HOME (empty, but
    `~/../../team/x` is /team/x: before, taken for nothing), `$PWD/...` at each work
    tree. A bare program is found on the sandbox's PATH (the host's, as the command's own
    programs are); another `$VAR` and `%f` name nothing Harness can find."""
    found: list[str] = []
    # (`${HOME}/x`, `"$HOME"/x`: `$HOME/x`)
    value = _BRACED_OR_QUOTED.sub(lambda match: f"${match[1] or match[2][1:]}", value)
    for command in _COMMAND_SEPARATORS.split(value.removeprefix("!")):
        words = [word for word in _WORD_SEPARATORS.split(command) if word]
        for index, word in enumerate(words):
            if "=" in word and not word.startswith("/"):
                word = word.partition("=")[2]  # (`--file=/x`, `VAR=/x`)
            elif word.startswith("-"):
                continue  # an option
            if _HOME_WORD.match(word):  # (`~/../../team/x`: the sandbox's HOME's)
                found.append(sandbox.HOME + _HOME_WORD.sub("", word, count=1))
                continue
            if _PWD_WORD.match(word):
                found += [tree + _PWD_WORD.sub("", word, count=1) for tree in trees]
                continue
            if not word or "$" in word or "%" in word:
                continue
            if word.startswith("~"):
                expanded = _expand_home(word)
                if expanded is not None:
                    found.append(expanded)
            elif word.startswith("/"):
                found.append(word)
            elif index or "/" in word:
                found += [os.path.join(tree, word) for tree in trees]
    return found


# A command line `_unread_command` reads whole: words of these characters, a word perhaps
# starting at a directory `_named_files` expands (`~/`, `~user/`, `$HOME/`, `${HOME}/`,
# `"$HOME"/`, the same of `$PWD`), or a whole word quoted (no space, nothing expanded
# inside; `_named_files` cuts words at quotes: `/team/gr"eet.sh"` is two of them). Anything
# else is the shell's to read: `;`, `&&`, `|`, `$VAR`, a backquote, a glob, a quoted
# space, a line break.
_PLAIN = r"A-Za-z0-9_%,:+@=./-"
_PLAIN_WORD = re.compile(
    r"(?:(?:~[A-Za-z0-9_.-]*|\$HOME|\$\{HOME\}|\"\$HOME\"|\$PWD|\$\{PWD\}|\"\$PWD\")(?=/|$))?"
    rf"""(?:[{_PLAIN}]*|'[{_PLAIN}]*'|"[{_PLAIN}]*")"""
)
_ANCHORED = re.compile(r"""[/~$"]""")  # (a word starting so is not relative)
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_UP = re.compile(r"(^|[/=])\.\.(/|$)")
# (a program whose options set where the program it runs is found: `env -C /team x`,
# `env PATH=/team/bin x`)
_SETS_ENVIRONMENT = re.compile(r"env")
# A diff or merge tool's command line (difftool.<tool>.cmd, mergetool.<tool>.cmd) and an
# argument of it naming a file git gives the tool, by the variable git sets to its path
# (git-difftool, git-mergetool: `meld "$LOCAL" "$MERGED" "$REMOTE"`, `--output="$MERGED"`):
# files of the work tree or temporary ones, never a program. Read as the shell's, every
# git preview of a repository (or sandbox home) with such a tool, `git status` too, was
# not appliable.
# Command-valued keys whose value is one program's path, not a command line (git's
# scripts run it quoted: git-mergetool--lib, git-web--browse, git-help's man viewers)
_PROGRAM_PATH = re.compile(r"((diff|merge)tool|browser|man)\..*\.path", re.DOTALL)
_TOOL_COMMAND = re.compile(r"(diff|merge)tool\..*\.cmd", re.DOTALL)
_TOOL_FILE = re.compile(
    r"(--?[A-Za-z0-9][A-Za-z0-9-]*=)?(\$(?:LOCAL|REMOTE|MERGED|BASE)"
    r"|\$\{(?:LOCAL|REMOTE|MERGED|BASE)\}|\"\$(?:LOCAL|REMOTE|MERGED|BASE)\")"
)


def _unread_command(key: str, value: str) -> str:
    """What of the command line `value` of the command-valued `key` `_named_files` cannot
    read whole (the shell's syntax, a variable set, a path relative to a directory
    unknown), quoted for a reviewer; "" when it is plain words it resolves. Before,
    `!cd /team && sh x.sh` was taken for `/team` and the work tree's `x.sh`, and
    `PATH=/team/bin:$PATH x` for nothing: /team/x.sh or /team/bin/x changed after the
    approval left the fingerprint as it was, and the old effect was applied."""
    if key.startswith("alias.") and not value.startswith("!"):
        return _unread_git_arguments(value)
    if key.startswith(("alias.", "credential.", "submodule.")):
        value = value.removeprefix("!")
    if re.search(r"[\n\r\v\f]", value):
        return "a line break"
    words = [word for word in re.split(r"[ \t]+", value) if word]
    tool = _TOOL_COMMAND.fullmatch(key) is not None
    for index, word in enumerate(words):
        shown = repr(word if len(word) <= 60 else word[:57] + "...")
        if index and tool and _TOOL_FILE.fullmatch(word):
            continue  # (a file git gives the tool: `_named_files` takes no path of it)
        if not _PLAIN_WORD.fullmatch(word):
            return shown
        if not index and _SETS_ENVIRONMENT.fullmatch(os.path.basename(word)):
            return shown
        if _ASSIGNMENT.match(word):
            return shown  # (`PATH=/team/bin x`, `env -i PATH=...`, `make CC=...`)
        if not _ANCHORED.match(word) and _UP.search(word):
            return shown  # (`../team/x`: from where the program runs, unknown here)
    return ""


def _unread_git_arguments(value: str) -> str:
    """What of an alias's git command line (git splits it itself, no shell: quotes and
    backslashes) `_named_files` cannot read whole: a backslash, a quoted part holding a
    space and a path, a path relative to the command's own directory that leaves it."""
    if "\\" in value:
        return "a backslash"
    for quoted in re.findall(r"'[^']*'|\"[^\"]*\"", value):
        if re.search(r"\s", quoted) and re.search(r"[/~]", quoted):
            return repr(quoted)
    for word in value.split():
        # (a path partly quoted, `-F /team/gr"eet"`: `_named_files` cuts it at the quote)
        quoted = re.fullmatch(r"'[^']*'|\"[^\"]*\"", word)
        if re.search(r"['\"]", word) and re.search(r"[/~]", word) and not quoted:
            return repr(word)
    for word in re.split(r"""[\s'"]+""", value):
        if _UP.search(word) and not word.startswith("/"):
            return repr(word)
    return ""


def _sandbox_homes() -> list[str]:
    """The home of the user sandboxed programs run as (the sandbox user, or Harness's)."""
    uid = _sandbox_uid()
    try:
        return [pwd.getpwuid(os.getuid() if uid is None else uid).pw_dir]
    except (KeyError, OverflowError):
        return []


def _enclosing_git_dir(workspace: Path, state: _OutsideState) -> list[tuple[str, str]]:
    """(the work tree, the git directory) of the nearest `.git` above the workspace, the
    `.git` file naming it described; none when there is none."""
    for above in Path(workspace).parents:
        dot_git = str(above / ".git")
        try:
            info = os.stat(dot_git)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode):
            return [(str(above), dot_git)]
        data = state.file(dot_git)
        target = _gitdir_of(data or b"", Path(dot_git))
        return [(str(above), str(target))] if target is not None else []
    return []


def _dot_git_target(base: Path, workspace: Path, rel: str) -> str | None:
    """The git directory the workspace's `.git` at `rel` (read under `base`, no link
    followed) is or names: itself, a symbolic link's target, a `gitdir:` file's."""
    where = workspace / rel
    try:
        fd = os.open(base / rel, _PATH)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            return str(where)
        if stat.S_ISLNK(info.st_mode):
            named = os.readlink("", dir_fd=fd)
            return os.path.normpath(os.path.join(where.parent, named))
        if stat.S_ISREG(info.st_mode):
            target = _gitdir_of(_read(fd), where)
            return None if target is None else str(target)
    except (OSError, ToolError):
        return None
    finally:
        os.close(fd)
    return None


def _file_state(path: str) -> tuple[str, bytes | None, str | None]:
    """(a line describing the file at `path`, links followed: missing, not a regular
    file, or its identity, mode, times and content's SHA-256; its content or None; the
    path it resolves to, or None)."""
    resolved = _resolve(path)
    if resolved is None:
        return f"{path}\0unresolved\n", None, None
    try:
        fd = os.open(resolved, _PATH)
    except (FileNotFoundError, NotADirectoryError):
        return f"{path}\0absent\n", None, resolved
    except OSError as error:
        return f"{path}\0error {error.errno}\n", None, resolved
    described = "unread"
    try:
        info = os.fstat(fd)
        described = _described(info)
        if not stat.S_ISREG(info.st_mode):
            return f"{path}\0{described}\n", None, resolved
        data = _read(fd)
    except (OSError, ToolError):
        return f"{path}\0{described} unread\n", None, resolved  # (larger than 1 MiB ...)
    finally:
        os.close(fd)
    digest = hashlib.sha256(data).hexdigest()
    return f"{path}\0{described} {digest}\n", data, resolved


def _directory_state(path: str) -> str:
    """A line describing the directory at `path` by each entry's name and state (at most
    MAX_LISTED), or what it is instead."""
    resolved = _resolve(path)
    if resolved is None:
        return f"{path}\0unresolved\n"
    try:
        fd = os.open(resolved, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return _file_state(path)[0]
    except OSError as error:
        return f"{path}\0error {error.errno}\n"
    try:
        entries = sorted(os.listdir(fd))
        shown = [
            f"{name}:{_described(os.stat(name, dir_fd=fd, follow_symlinks=False))}"
            for name in entries[:MAX_LISTED]
        ]
        head = _described(os.fstat(fd))
    except OSError as error:
        return f"{path}\0error {error.errno}\n"
    finally:
        os.close(fd)
    partial = _PARTIAL if len(entries) > MAX_LISTED else "\n"
    return f"{path}\0{head} {len(entries)}\0{'/'.join(shown)}{partial}"


def _pseudo_refs_state(path: str) -> str:
    """A line describing the pseudo-refs at the top of the git directory `path` (the
    entries named as one, `_PSEUDO_REF`) by name and state."""
    try:
        with os.scandir(path) as entries:
            shown = [
                f"{entry.name}:{_described(entry.stat(follow_symlinks=False))}"
                for entry in sorted(entries, key=lambda entry: entry.name)
                if _PSEUDO_REF.fullmatch(entry.name)
            ]
    except OSError as error:
        return f"{path}\0pseudo-refs error {error.errno}\n"
    partial = _PARTIAL if len(shown) > MAX_LISTED else "\n"
    return f"{path}\0pseudo-refs\0{'/'.join(shown[:MAX_LISTED])}{partial}"


def _pseudo_ref_links(path: str) -> list[str]:
    """The pseudo-refs at the top of the git directory `path` that are links (git reads
    `ORIG_HEAD -> /team/orig` through it)."""
    try:
        with os.scandir(path) as entries:
            return sorted(
                entry.path
                for entry in entries
                if _PSEUDO_REF.fullmatch(entry.name) and entry.is_symlink()
            )
    except OSError:
        return []


def _described(info: os.stat_result) -> str:
    return (
        f"{info.st_dev}:{info.st_ino} {info.st_mode:o} {info.st_size} "
        f"{info.st_mtime_ns} {info.st_ctime_ns}"
    )


def _identity_state(path: str) -> str:
    """A line describing the file at `path`, links followed, by what it resolves to and
    that file's identity, mode, size and times (its content unread); or what it is
    instead: missing, unresolved, an error."""
    resolved = _resolve(path)
    if resolved is None:
        return f"{path}\0unresolved\n"
    try:
        info = os.lstat(resolved)
    except (FileNotFoundError, NotADirectoryError):
        return f"{path}\0absent\n"
    except OSError as error:
        return f"{path}\0error {error.errno}\n"
    return f"{path}\0{resolved}\0{_described(info)}\n"
