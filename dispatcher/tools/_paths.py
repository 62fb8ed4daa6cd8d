"""Workspace paths and output caps shared by the built-in tools and the confinement guard.

`path_violation` is the single definition of "a path inside the workspace": the guard
denies with its text, and tool bodies call `resolve_in_workspace` again at run time
(defense in depth: time has passed, a symlink may have appeared), then do their I/O on
the resolved path through `_confined`, which follows no symlink (the workspace can keep
changing after this check).
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
import unicodedata
from pathlib import Path

from dispatcher.tools import sandbox
from dispatcher.tools.base import ToolError

EXAMPLE = "src/app.py"


def path_violation(value: object, workspace: Path) -> str | None:
    """Why `value` is not a relative path that stays inside `workspace`, or None.

    Symlinks are followed (in parent directories and in the final component) inside the
    workspace only (`_resolve_beneath`), so a path that does not exist yet is fine as long
    as it would land inside the workspace, and a path that leaves the workspace at any
    step (a `..` above it, a link to elsewhere, even one that would come back) is refused
    with one answer, whatever the host holds outside: nothing outside is ever looked at.
    """
    return _checked(value, workspace)[0]


def _checked(value: object, workspace: Path) -> tuple[str | None, Path]:
    """(`path_violation`'s answer, the resolved path when there is no violation)."""
    try:
        root = workspace.resolve()
    except (OSError, RuntimeError):
        # A symlink on the workspace's own path changed while it was read (a workspace
        # nested in another agent's, whose program flips a directory of it): Python's
        # resolve then raised EINVAL from a readlink of what was no longer a link.
        return WORKSPACE_CHANGED, workspace
    given = Path(os.path.abspath(workspace))
    try:  # `root` is the workspace's own path, not a tree a flipped link led to: every
        for fd in _hold_root(root, given):  # answer below names it
            os.close(fd)
    except _Changed:
        return WORKSPACE_CHANGED, workspace
    problem = _violation(value, root)
    if problem is not None or not isinstance(value, str):
        return problem, root
    try:
        resolved = _resolve_beneath(root, given, value)
    except _Changed:
        return WORKSPACE_CHANGED, root
    except (OSError, RuntimeError, ValueError) as error:
        # Said by kind only: Python's message names the path the resolve had reached (a
        # symlink loop's), which may lie in a tree outside the workspace that Harness
        # followed as root and the agent's sandbox never shows.
        why = "a symlink loop" if isinstance(error, RuntimeError) else type(error).__name__
        return f"Path {value!r} cannot be resolved ({why}). Use a plain relative path.", root
    if resolved is None:
        return (
            f"Path {value!r} resolves outside the session workspace ({root}). "
            f"Use a path relative to the workspace, e.g. '{EXAMPLE}'."
        ), root
    return None, resolved


MAX_LINKS = 40  # symlinks followed in one path, as Linux's own limit: more is a loop
_DIRECTORY_HELD = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Changed(Exception):
    """The workspace's root stopped being the directory resolved a moment before."""


def _resolve_beneath(root: Path, given: Path, value: str) -> Path | None:
    """`value` resolved inside the workspace `root` (its path resolved; `given`: the path
    it was named by), or None when a step leaves it.

    Each component is looked at relative to a descriptor of its directory, held from the
    root down, opened with no symlink followed, so nothing outside the workspace is ever
    looked at: a symlink there is read (`readlink`) and its target followed only while it
    stays below the root; an absolute target counts only when it is, as text, under the
    root (or the path the workspace was given by). A `..` above the root is a step
    outside: None, even when later steps would come back, because where they would land
    depends on the host's directories (a link there would make it another place). A
    component that does not exist ends the looking; the rest is read as text, as
    `Path.resolve(strict=False)` does. Raises RuntimeError for more than MAX_LINKS links
    (a loop), `_Changed` when the root cannot be held as a directory now.
    """
    fds = _hold_root(root, given)
    names: list[str] = []  # components below the root; fds[i] holds names[:i] when opened
    # Read from its end (the next component last): taking each from the front moved the
    # whole rest, so a path of a million slashes held a request's thread for minutes.
    pending = value.split("/")[::-1]
    links = 0
    try:
        while pending:
            part = pending.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if not names:
                    return None
                names.pop()
                if len(fds) > len(names) + 1:
                    os.close(fds.pop())
                continue
            held = len(fds) == len(names) + 1  # this component's directory is held
            info = _lstat(part, fds[-1]) if held else None
            if info is not None and stat.S_ISLNK(info.st_mode):
                links += 1
                if links > MAX_LINKS:
                    raise RuntimeError("too many symlinks")
                target = os.readlink(part, dir_fd=fds[-1])
                if target.startswith("/"):
                    below = _below(target, (root, given))
                    if below is None:
                        return None
                    while len(fds) > 1:
                        os.close(fds.pop())
                    names, target = [], below
                pending.extend(reversed(target.split("/")))  # (read next)
                continue
            names.append(part)
            if info is not None and stat.S_ISDIR(info.st_mode):
                fds.append(os.open(part, _DIRECTORY_HELD, dir_fd=fds[-1]))
    finally:
        for fd in fds:
            os.close(fd)
    return root.joinpath(*names)


def _hold_root(root: Path, given: Path) -> list[int]:
    """[a descriptor of the workspace], opened as the sandbox opens it (no symlink a
    program may have placed followed, `sandbox.open_unredirected`), or [] when there is no
    workspace yet (every path is then text). Raises `_Changed` when it cannot be opened so,
    or is not `root`, the path resolved a moment before: in a workspace nested in another
    agent's, whose program flips a directory on the path, a walk of the resolved path (or
    of a path through the flipped link) read another tree, a person's, and the answer told
    what that tree holds."""
    if sandbox.mode() == "off":
        # (no sandbox: programs run as Harness, so no link on the path is theirs alone to
        # have placed; a workspace given through a symlink is opened as resolved)
        try:
            return [os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
        except OSError as error:
            if not os.path.lexists(given):
                return []
            raise _Changed from error
    try:
        fd = sandbox.open_unredirected(given)
    except (ToolError, OSError) as error:
        if not os.path.lexists(given):
            return []
        raise _Changed from error
    try:
        same = os.readlink(f"/proc/self/fd/{fd}") == str(root)
    except OSError:
        same = False
    if not same:
        os.close(fd)
        raise _Changed
    return [fd]


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    """`name`'s own status in the directory held by `dir_fd`, or None when it is not there."""
    try:
        return os.lstat(name, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _below(target: str, roots: tuple[Path, ...]) -> str | None:
    """The absolute link target `target` relative to the first of `roots` it lies under, as
    text (its `..` are followed by the walk, which refuses one above the root), or None.

    Compared by whole components, empty ones and `.` left out as the kernel leaves them
    (`//ws/src`, `/ws/./src` are `/ws/src`; `/ws2` is not under `/ws`); a `..` is never
    left out (where it leads depends on links), so one before the root's end is outside."""
    parts = [part for part in target.split("/") if part not in ("", ".")]
    for root in roots:
        prefix = [part for part in str(root).split("/") if part]
        if parts[: len(prefix)] == prefix:
            return "/".join(parts[len(prefix) :])
    return None


WORKSPACE_CHANGED = (
    "The session workspace's path changed while this path was checked (a symlink may "
    "stand on it now), so nothing was done. Try again; if it persists, an operator must "
    "look at the workspace (and not nest one agent's workspace in another's)."
)


def _violation(value: object, root: Path) -> str | None:
    """What is wrong with `value` before anything is resolved, or None."""
    if not isinstance(value, str):
        return f"Path must be a string relative to the workspace, got {type(value).__name__}."
    if "\x00" in value:
        return f"Path {value!r} contains a NUL byte. Use a plain relative path, e.g. '{EXAMPLE}'."
    if value.startswith("~"):
        return (
            f"Path {value!r} starts with '~'; home directories are not expanded. "
            f"Use a path relative to the session workspace ({root}), e.g. '{EXAMPLE}'."
        )
    if Path(value).is_absolute():
        return (
            f"Path {value!r} is absolute. "
            f"Use a path relative to the session workspace ({root}), e.g. '{EXAMPLE}'."
        )
    return None


# Control characters (C0, DEL, C1 with NEL), format characters (bidi overrides, zero-width
# marks), and the line and paragraph separators: a path holding one reads differently to
# a person, to Harness's line-based readers and to the client (Python splits lines on
# U+2028, Rust's str::lines does not), so it is never a client path.
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def unsafe_character(value: str) -> str | None:
    """A description of the first control, format or line/paragraph-separator character
    in `value` ("U+2028 (LINE SEPARATOR) at offset 5"), or None when it has none."""
    for offset, char in enumerate(value):
        if unicodedata.category(char) in UNSAFE_CATEGORIES:
            name = unicodedata.name(char, "a control character")
            return f"U+{ord(char):04X} ({name}) at offset {offset}"
    return None


def lexical_relative(value: object, project: Path | str) -> str | None:
    """`value` as a path relative to `project`, read lexically: nothing is resolved on
    this host's disk, because the files are on the client's (a decide-only call's paths).

    An absolute path must lie under `project`; a relative one is read against it; `..`
    is folded textually. None when the path leaves `project`, or is not a plain path (not
    a string, a control, format or line-separator character (`unsafe_character`), `~`,
    white space first or last: Claude Code trims a path before it reads it, so
    " /etc/hosts" is /etc/hosts to it, not a relative name). "" and the project itself
    are ".".
    """
    if not isinstance(value, str) or value.startswith("~") or unsafe_character(value):
        return None
    if value != value.strip():
        return None
    root = re.sub(r"^/+", "/", posixpath.normpath(str(project)))
    if not root.startswith("/"):
        return None  # a project directory that is not an absolute POSIX path: fail closed
    joined = posixpath.join(root, value) if value else root
    path = re.sub(r"^/+", "/", posixpath.normpath(joined))
    if path == root:
        return "."
    prefix = root.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else None


def lexical_path_violation(value: object, project: Path | str) -> str | None:
    """Why `value` is not a path inside the client's project directory, or None (see
    `lexical_relative`): the confinement of decide-only calls.

    A path holding braces must stay inside in every brace alternative too
    (`brace_alternatives`): a client's glob expands them before it walks (Gemini CLI's
    `glob` and `read_many_files`, with node's glob: `{../../etc/*,x}` lists /etc), and
    `..` folded as text inside a brace (`{..` is a name) hid the way out."""
    if not isinstance(value, str):
        return f"Path must be a string, got {type(value).__name__}."
    if lexical_relative(value, project) is not None:
        alternatives = brace_alternatives(value)
        if alternatives is None:
            return (
                f"Path {value[:200]!r}... has more brace alternatives than Harness checks "
                f"({MAX_BRACE_ALTERNATIVES}, or {MAX_BRACE_WORK} characters in all). Use a "
                f"plain path or a simpler pattern inside {project}."
            )
        for alternative in alternatives:
            if lexical_relative(alternative, project) is None:
                return (
                    f"Path {value!r} is outside the project directory {project} in its brace "
                    f"alternative {alternative!r} (a client's glob expands braces); only "
                    "files inside it may be used in this session."
                )
        return None
    unsafe = unsafe_character(value)
    if unsafe is not None:
        return (
            f"Path {value!r} contains {unsafe}, which the client may read as another path. "
            f"Use a plain path inside {project}."
        )
    if value.startswith("~"):
        return f"Path {value!r} starts with '~'. Use a path inside the project directory {project}."
    if value != value.strip():
        return (
            f"Path {value!r} starts or ends with white space, which the client strips (it may "
            f"then name another path). Use a plain path inside {project}."
        )
    return (
        f"Path {value!r} is outside the project directory {project}; only files inside it "
        "may be used in this session."
    )


MAX_BRACE_ALTERNATIVES = 1024
# Characters read while expanding (one path of at most this many, or its alternatives
# together): a long path with braces is refused rather than read slowly.
MAX_BRACE_WORK = 1 << 18


def brace_alternatives(value: str) -> tuple[str, ...] | None:
    """Every text `value`'s braces expand to as a glob expands them (`a/{b,c/d}/e` is
    `a/b/e` and `a/c/d/e`; nested groups too; a group with no comma at its own level,
    such as `{a}` or the sequence `{1..3}`, whose items hold no `/` or `.`, stays as it
    is), or None past MAX_BRACE_ALTERNATIVES or MAX_BRACE_WORK characters read. A
    backslash is read as no escape, so an escaped brace is expanded too: more
    alternatives are checked, never fewer."""
    if "{" not in value:
        return (value,)
    if len(value) > MAX_BRACE_WORK:
        return None
    done: list[str] = []
    pending = [value]
    work = 0
    while pending:
        text = pending.pop()
        work += len(text)
        group = _first_group(text)
        if group is None:
            done.append(text)
        else:
            start, end, items = group
            # Bounded before the texts are made: each is read once popped, so texts longer
            # in all than the work left end in None anyway (made first, 100,000 items before
            # 100,000 characters, in a 256 KiB pattern, were 10 GB of memory).
            made = len(items) * (len(text) - (end + 1 - start)) + sum(map(len, items))
            alternatives = len(done) + len(pending) + len(items)
            if alternatives > MAX_BRACE_ALTERNATIVES or work + made > MAX_BRACE_WORK:
                return None
            pending.extend(reversed([text[:start] + item + text[end + 1 :] for item in items]))
        if len(done) + len(pending) > MAX_BRACE_ALTERNATIVES or work > MAX_BRACE_WORK:
            return None
    return tuple(done)


def _first_group(text: str) -> tuple[int, int, list[str]] | None:
    """(offset of `{`, offset of its `}`, its items) of the first brace group in `text`
    with a comma at its own level, or None. One pass: each `{` is matched to its `}` on
    a stack, which keeps the offsets of the commas at its level."""
    stack: list[tuple[int, list[int]]] = []
    first: tuple[int, int, list[int]] | None = None
    for offset, char in enumerate(text):
        if char == "{":
            stack.append((offset, []))
        elif char == "," and stack:
            stack[-1][1].append(offset)
        elif char == "}" and stack:
            start, commas = stack.pop()
            if commas and (first is None or start < first[0]):
                first = (start, offset, commas)
    if first is None:
        return None
    start, end, commas = first
    cuts = [start, *commas, end]
    return start, end, [text[a + 1 : b] for a, b in zip(cuts, cuts[1:], strict=False)]


def resolve_in_workspace(workspace: Path, relative: str) -> Path:
    """The resolved absolute path of `relative` inside `workspace` (resolved once: the
    path that was checked is the path returned).

    Raises ToolError when it is not a relative path that stays inside the workspace. The
    workspace may change right after: open the result only through `_confined`, which
    refuses a symlink that appears in it.
    """
    problem, resolved = _checked(relative, workspace)
    if problem is not None:
        raise ToolError(problem)
    return resolved


def cap_text(text: str, limit: int, hint: str) -> str:
    """`text` cut to `limit` characters, with a note saying how much was left out and why."""
    if len(text) <= limit:
        return text
    hidden = len(text) - limit
    return f"{text[:limit]}\n[truncated: {hidden} more characters; {hint}]"


def looks_binary(head: bytes) -> bool:
    """True when the first bytes of a file contain a NUL (the usual binary-file test)."""
    return b"\x00" in head
