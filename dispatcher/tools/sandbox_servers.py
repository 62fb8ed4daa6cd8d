"""The sandbox of programs that keep running: upstream stdio MCP servers.

`sandboxed_argv(argv, paths, held)` wraps a server's command in the same sandbox as
`sandbox.run` (dispatcher/tools/sandbox.py: namespaces, the sandbox user, the seccomp
filter, limits): its configured paths (read-write, or read-only with `:ro`) and what its
program needs to start take the workspace's place. The worker's MCP client starts it.

Every configured path, writable or read-only, is bound by the descriptor of what was
judged, as the workspace is: the MCP client starts the server and passes it no
descriptor, so this process holds it (`held`) and the launcher opens it again through
/proc/<this process>/fd/<n> (REOPEN) before bwrap, which binds it with --bind-fd or
--ro-bind-fd (and checks that what it mounted is that one). A path swapped for a symlink
after the check binds nothing else: bound by path, a read-only path a program exchanged
with a symlink at the right moment had bwrap, as root, show the server any directory.
The HARNESS_SANDBOX_READ_ONLY entries are held and bound the same way
(sandbox.hold_read_only_extras).

The server's configured environment is no part of its launcher's: the launcher (shell,
prlimit, REOPEN, bwrap outside the sandbox as Harness, setpriv inside it as root) runs
with LAUNCHER_ENVIRONMENT, and the variables reach the server through a descriptor held
the same way (ENVIRONMENT_FD), applied by a shell run as the sandbox user after setpriv
(APPLY_ENVIRONMENT), never through an argv another user of the host could read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import shlex
import shutil
import stat
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path

from django.conf import settings

from dispatcher.tools import sandbox_cgroups
from dispatcher.tools.base import ToolError
from dispatcher.tools.sandbox import (
    EXIT_REPORT_PROCESSES,
    SYSTEM_DIRS,
    Bind,
    Limits,
    _inside,
    _limit_command,
    _owner,
    _programs_may_place_in,
    _require_pids_cgroup,
    give_to_sandbox,
    hidden_paths,
    hold_read_only_extras,
    mode,
    open_unredirected,
    read_only_entry_holding,
    read_only_extras,
    read_only_way_in,
    redirection,
    require_sandbox,
    sandbox_command,
    system_problem,
)

# A server lives across calls, so the per-call wall clock does not apply (the worker's
# pool applies each call's timeout and replaces a server that ran past it); CPU time is
# bounded per process by a generous ceiling instead: past it the server is killed and
# started again at the next call.
SERVER_LIMITS = Limits(timeout=3600, output_chars=0, cpu_seconds=3600)
READ_ONLY_SUFFIX = ":ro"
READ_WRITE_SUFFIX = ":rw"
SCRIPT_SUFFIXES = (".py", ".js", ".mjs", ".cjs", ".ts", ".sh")
# Never given to a server, even read-only: a socket stays connectable on a read-only bind.
KERNEL_AND_SOCKET_DIRS = ("/proc", "/sys", "/dev", "/run")
# The launcher's step that takes the paths' descriptors this process holds: each
# "SOURCE=N=DEV:INO" opens SOURCE (/proc/<pid>/fd/<fd>: the very directory or file held,
# whatever its path leads to now) as descriptor N, then the rest of the command runs with
# them. DEV:INO is what was judged: a descriptor closed meanwhile (the session over, its
# number reused for another file or directory of this process) stops the start.
REOPEN = """
import os, sys
args = sys.argv[1:]
cut = args.index("--")
for spec in args[:cut]:
    source, number, identity, access = spec.split("=")
    try:
        fd = os.open(source, os.O_RDONLY if access == "read" else os.O_PATH)
        info = os.fstat(fd)
    except OSError as error:
        sys.exit(f"harness: what the server was given, held as {source}, is gone ({error.strerror})")
    if f"{info.st_dev}:{info.st_ino}" != identity:
        sys.exit(f"harness: what the server was given, held as {source}, is gone (another file)")
    if fd == int(number):  # (opened as that number already: it only has to be inherited)
        os.set_inheritable(fd, True)
    else:
        os.dup2(fd, int(number))
        os.close(fd)
os.execv(args[cut + 1], args[cut + 1:])
"""
FIRST_PATH_FD = 10  # the launcher's descriptors for the paths (0-4 are taken)
# The launcher's environment, whatever the server is given: the shell, prlimit, REOPEN
# and bwrap run outside the sandbox as Harness (root, often), and setpriv runs as root
# inside it before it drops to the sandbox user. A server's configured environment was
# theirs too, and LD_PRELOAD naming a library an agent's sandboxed program built ran that
# library as root on the host.
LAUNCHER_ENVIRONMENT = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
# The server's environment reaches it as a script on this descriptor (a sealed memfd this
# process holds, opened again by REOPEN as ENVIRONMENT_FD; never in an argv, which any
# user of the host reads in /proc/<pid>/cmdline), read by APPLY_ENVIRONMENT, which runs
# inside the sandbox after setpriv, as the sandbox user, from an empty environment (env
# -i): it closes the descriptor, exports the variables and becomes the server.
ENVIRONMENT_FD = 4
APPLY_ENVIRONMENT = (
    f'script=$(cat <&{ENVIRONMENT_FD}) && exec {ENVIRONMENT_FD}<&- && eval "$script" '
    '|| { echo "harness: the environment of the server was not applied" >&2; exit 125; }; '
    'exec "$@"'
)
# What a shell can export (POSIX's portable names, with lower case).
VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_server_path(entry: str) -> tuple[Path, bool]:
    """A configured server path, `PATH` or `PATH:rw` (read-write) or `PATH:ro`
    (read-only): (the path, writable)."""
    if entry.endswith(READ_ONLY_SUFFIX):
        return Path(entry.removesuffix(READ_ONLY_SUFFIX)), False
    return Path(entry.removesuffix(READ_WRITE_SUFFIX)), True


def server_path_problem(entry: str) -> str | None:
    """Why a configured server path cannot be given to a server, or None."""
    try:
        return _path_problem(entry)
    except (OSError, RuntimeError) as error:  # (a symlink on it changing while it is read)
        return f"Path {entry!r} changed while it was being checked ({error})."


def _path_problem(entry: str) -> str | None:
    path, writable = parse_server_path(entry)
    if not path.is_absolute():
        return f"Path {entry!r} must be absolute (optionally ending in :ro or :rw)."
    if not path.exists():
        return f"Path {path} does not exist on this host."
    if (redirected := redirection(path)) is not None:
        return f"Path {path} {redirected}."
    path = path.resolve()
    if path == Path("/") or any(_inside(Path(p), path) for p in (*SYSTEM_DIRS, "/etc")):
        return f"Path {path} holds system directories; a server may only read those."
    if any(_inside(path, Path(p)) for p in KERNEL_AND_SOCKET_DIRS):
        return f"Path {path} is a kernel or socket directory (/proc, /sys, /dev, /run)."
    workspace_root = Path(settings.HARNESS_WORKSPACE_ROOT).resolve()
    for hidden in hidden_paths():
        if path == hidden or (_inside(path, hidden) and not _inside(path, workspace_root)):
            return (
                f"Path {path} is Harness's own state (data, settings, database or "
                "workspace root), which sandboxed programs never see."
            )
        # the server could rename a parent it owns, as in sandbox.refuse_exposed_state
        if writable and _inside(hidden, path) and hidden.parent != path:
            return (
                f"Path {path} holds Harness's own state ({hidden}), which sandboxed "
                "programs never see; it cannot be writable."
            )
    # The server writes there: a step of a read-only entry's way it swapped for a symlink
    # between a run's check and bwrap's bind had every run show what it pointed to.
    if writable and (way := read_only_way_in(path)):
        return (
            f"Path {path} holds the way to the HARNESS_SANDBOX_READ_ONLY entry {way}, "
            "where only admins may write; it cannot be writable."
        )
    # Inside an entry, what the server writes every sandboxed program reads (and runs).
    if writable and (holder := read_only_entry_holding(path)):
        return (
            f"Path {path} lies in the HARNESS_SANDBOX_READ_ONLY entry {holder}, which every "
            "sandboxed program reads; it cannot be writable."
        )
    # Given to the sandbox user when Harness is root, as a workspace is: the same rule
    # (/root/.ssh, /var/spool's crontabs, /var/lib's databases, /boot, /home whole).
    if writable and (reason := system_problem(path)):
        return f"Path {path} {reason}; it cannot be writable."
    if not writable and not _readable_by_sandbox_user(path):
        return (
            f"Path {path} cannot be read by the sandbox user ({settings.HARNESS_SANDBOX_USER}), "
            "as whom servers run when Harness is root. Make it readable to others "
            "(chmod o+rX), or register it writable (:rw; it is then given to that user)."
        )
    return None


def _readable_by_sandbox_user(path: Path) -> bool:
    """Whether the sandbox user may read `path` (and enter it, for a directory), by its
    mode bits; its parents are the sandbox's own directories (mode 0755). True when
    Harness is not root: the server runs as Harness then."""
    user = _owner()
    if user is None:
        return True
    info = path.stat()
    shift = 6 if info.st_uid == user[0] else 3 if info.st_gid == user[1] else 0
    needed = 0o5 if stat.S_ISDIR(info.st_mode) else 0o4
    return (info.st_mode >> shift) & needed == needed


def _hold_checked(path: Path, checked: Path) -> int:
    """A descriptor of the server path `checked` (what `path` resolved to when it was
    checked), opened with no symlink a program could have placed followed
    (open_unredirected), for the bind (the caller closes it). ToolError when what it
    opens is no longer what was checked."""
    fd = open_unredirected(Path(os.path.abspath(path)), file_ok=True)
    try:
        held = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if held != checked:
            raise ToolError(
                f"Path {path} changed while the server was being set up (it leads to {held} "
                f"now, not {checked}). The server was not started; an admin must look at it."
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _give_checked(path: Path, checked: Path) -> int:
    """Give the writable server path `checked` (what `path` resolved to when it was
    checked) to the sandbox user by the descriptor of the directory judged
    (_hold_checked), never by a path resolved again: another server's program swapping a
    directory for a symlink after the check had root give the symlink's target away.
    Returns that descriptor, for the bind (the caller closes it). ToolError when the
    directory is no longer the one checked."""
    fd = _hold_checked(path, checked)
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            raise ToolError(
                f"Path {path} is not a directory, and only a directory can be a server's "
                "writable path. The server was not started; an admin must fix it."
            )
        give_to_sandbox(checked, root_fd=fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def environment_problem(env: Mapping[str, str]) -> str | None:
    """Why a stdio server may not be given the environment `env`, or None: a name a shell
    cannot export (APPLY_ENVIRONMENT exports them inside the sandbox), or a value holding
    a NUL character (no environment can), or what is not UTF-8 text (a lone surrogate,
    as Python decodes undecodable bytes of a command line). Any variable is the server's own otherwise, the
    dynamic loader's (LD_LIBRARY_PATH, LD_PRELOAD) included: it reaches the server alone,
    as the sandbox user, never its launcher. Nothing is refused with HARNESS_SANDBOX=off,
    where the server is given its environment directly."""
    if mode() == "off":
        return None
    for name, value in sorted(env.items()):
        if not VARIABLE_NAME.fullmatch(name):
            return (
                f"Variable name {name!r} cannot be given to a stdio server: use letters, "
                "digits and underscores, not starting with a digit."
            )
        if "\0" in value:
            return f"Variable {name} holds a NUL character, which no environment can."
        try:
            value.encode()
        except UnicodeEncodeError:  # (a lone surrogate: bytes of no encoding, from argv)
            return (
                f"Variable {name} holds something that is not UTF-8 text, which the "
                "server's environment is written in."
            )
    return None


def environment_script(env: Mapping[str, str]) -> bytes:
    """What APPLY_ENVIRONMENT evaluates: `env` exported, every value quoted, and nothing
    else (the PWD the shell sets itself taken out again unless it is configured)."""
    lines = ["unset PWD"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]
    return ("\n".join(lines) + "\n").encode()


def _hold_environment(env: Mapping[str, str], held: contextlib.ExitStack) -> int:
    """A sealed memfd holding `env` as environment_script, readable by its owner alone,
    which `held` closes."""
    problem = environment_problem(env)
    if problem is not None:
        raise ToolError(f"{problem} The server was not started; an admin must fix it.")
    fd = os.memfd_create("harness-server-environment", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    held.callback(os.close, fd)
    script = memoryview(environment_script(env))
    while script:
        script = script[os.write(fd, script) :]
    os.fchmod(fd, 0o400)
    seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def sandboxed_argv(
    argv: list[str],
    paths: list[str],
    held: contextlib.ExitStack,
    environment: Mapping[str, str] | None = None,
) -> list[str]:
    """`argv` (a long-running server's command) wrapped in the sandbox, seeing only
    `paths` (see parse_server_path) and what its program needs to start (program_binds),
    and, when given, with `environment` as its whole environment, applied after the drop
    to the sandbox user (APPLY_ENVIRONMENT; start the command with LAUNCHER_ENVIRONMENT).

    The same sandbox as `run` (namespaces, the sandbox user, seccomp, no network unless
    HARNESS_SANDBOX_NETWORK, limits), started by the caller; a writable path is given to
    the sandbox user when Harness is root (give_to_sandbox) and bound by the descriptor
    of the directory judged, which `held` keeps open: start the command before `held`
    closes, in this process (the module's docstring). With HARNESS_SANDBOX=off, `argv`
    as it is. Raises SandboxUnavailable when the sandbox cannot run here and ToolError
    for a path or an environment that cannot be given: nothing is started unsandboxed.
    """
    if mode() == "off":
        return list(argv)
    require_sandbox()
    binds: list[Bind] = []
    reopen: list[str] = []
    command = list(argv)
    if environment is not None:
        own = _hold_environment(environment, held)
        judged = os.fstat(own)
        source = f"/proc/{os.getpid()}/fd/{own}"
        reopen.append(f"{source}={ENVIRONMENT_FD}={judged.st_dev}:{judged.st_ino}=read")
        apply = ["/bin/sh", "-c", APPLY_ENVIRONMENT, "harness-environment"]
        command = ["/usr/bin/env", "-i", *apply, *argv]
    for entry in paths:
        problem = server_path_problem(entry)
        if problem:
            raise ToolError(f"{problem} The server was not started; an admin must fix it.")
        path, writable = parse_server_path(entry)
        try:
            checked = path.resolve()
        except (OSError, RuntimeError) as error:  # (a symlink on it changing meanwhile)
            raise ToolError(
                f"Path {path} changed while the server was being set up ({error}). The "
                "server was not started; an admin must look at it."
            ) from None
        own = _give_checked(path, checked) if writable else _hold_checked(path, checked)
        held.callback(os.close, own)
        fd = FIRST_PATH_FD + len(binds)
        reopen.append(_reopen_spec(own, fd))
        binds.append(Bind(checked, checked, writable=writable, fd=fd))
    configured = list(binds)
    # The HARNESS_SANDBOX_READ_ONLY entries, by the descriptors of what was judged too.
    extras: list[Bind] = []
    for extra in hold_read_only_extras(held):
        assert extra.fd is not None
        fd = FIRST_PATH_FD + len(configured) + len(extras)
        reopen.append(_reopen_spec(extra.fd, fd))
        extras.append(dataclasses.replace(extra, fd=fd))
    for bind in program_binds(argv, [b.source for b in configured if b.writable]):
        # What a configured path shows already at its own place (a program inside the
        # server's writable path) is not bound again: by path and read-only, over the
        # bind of the descriptor judged, it hid the writable one and followed a symlink
        # exchanged in at the mount.
        if bind.source == bind.target and any(_inside(bind.source, c.source) for c in configured):
            continue
        binds.append(bind)
    directories = [b.target for b in binds[: len(paths)] if b.source.is_dir()]
    cwd = directories[0] if directories else Path("/tmp")  # noqa: S108 - the private one
    _require_pids_cgroup()
    cgroups = sandbox_cgroups.make(
        SERVER_LIMITS.processes + EXIT_REPORT_PROCESSES,
        SERVER_LIMITS.memory,
        name=f"server-{uuid.uuid4().hex}",
    )
    steps = [sys.executable, "-I", "-S", "-c", REOPEN, *reopen, "--"] if reopen else []
    return (
        _limit_command(SERVER_LIMITS, cgroups, report_exit=True)
        + steps
        + sandbox_command(
            command,
            binds=binds,
            cwd=cwd,
            limits=SERVER_LIMITS,
            network=bool(settings.HARNESS_SANDBOX_NETWORK),
            extras=extras,
        )
    )


def _reopen_spec(own: int, fd: int) -> str:
    """REOPEN's spec that opens what this process holds as `own` as descriptor `fd`."""
    judged = os.fstat(own)
    return f"/proc/{os.getpid()}/fd/{own}={fd}={judged.st_dev}:{judged.st_ino}=path"


def beyond_what_is_shown(command: list[str], env: dict[str, str]) -> str | None:
    """What of a server's command would have the sandbox show it a file on the host
    beyond what it shows every program (system directories, HARNESS_SANDBOX_READ_ONLY),
    or None: an absolute-path argument (`program_binds` shows a file in `node_modules`
    with its whole npm prefix, a file in a virtual environment with the environment,
    any other program or script alone), the program as the server's PATH finds it, or a
    directory of a PATH the server is given (a program put there later would be found).
    Whether it exists yet does not matter: it may be made before the server starts."""
    named = [arg for arg in command if arg.startswith("/")]
    if command and "/" not in command[0]:
        search = env.get("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
        named += [directory for directory in search.split(os.pathsep) if "PATH" in env]
        found = shutil.which(command[0], path=search)
        named += [found] if found else []
    for entry in named:
        path = Path(entry)
        try:
            resolved = path.resolve()
        except (OSError, RuntimeError):
            return entry
        if not (path.is_absolute() and _visible(path) and _visible(resolved)):
            return entry
    return None


def program_binds(argv: list[str], writable: list[Path] | None = None) -> list[Bind]:
    """Read-only binds for what the program needs to start, found from its absolute-path
    arguments that are files the sandbox would not show otherwise:

    - a file inside a Python virtual environment (a `pyvenv.cfg` above it): the
      environment, and the installation of its base interpreter (`home` in pyvenv.cfg);
    - a file inside `node_modules`: the directory holding the outermost `node_modules`
      (an npm prefix: package.json and the packages);
    - an executable or a script (`.py`, `.js`, ...): that file alone;
    and the same for the file a symlink argument points to. Data files are never bound
    this way (a server's data are its configured paths), nor anything that is or holds
    Harness's own state.
    """
    binds: dict[Path, Bind] = {}
    for arg in argv:
        path = Path(arg)
        if not path.is_absolute() or not path.is_file():
            continue
        try:
            resolved = path.resolve()
        except (OSError, RuntimeError):  # (a symlink on it changing meanwhile: not shown)
            resolved = path
        # A file a program may have put there (a link in the server's writable path,
        # node_modules/.bin/server) leads where that program chose: only to what the
        # server's writable paths show anyway, never to a directory bound for it.
        theirs = _programs_may_write(path, writable or [])
        for candidate in dict.fromkeys([path, resolved]):
            if any(_inside(candidate, bound) for bound in binds):
                continue  # shown already (a venv's interpreter, say)
            for bind in _runtime_of(candidate, writable or []):
                if theirs and not any(_inside(bind.source, w) for w in writable or []):
                    raise ToolError(
                        f"The server's program {path} lies where sandboxed programs write "
                        "(a server's writable path, an agent's workspace) and leads to "
                        f"{bind.source}, which the sandbox would have to show; the server "
                        "was not started. An admin must install the program elsewhere, "
                        "where only admins write."
                    )
                binds.setdefault(bind.target, bind)
    return list(binds.values())


def _runtime_of(path: Path, writable: list[Path]) -> list[Bind]:
    if _visible(path):
        return []
    for parent in path.parents:
        config = parent / "pyvenv.cfg"
        if config.is_file():
            return [_bind_tree(parent), *_base_interpreter(config, writable)]
    parts = path.parts
    if "node_modules" in parts:
        prefix = Path(*parts[: parts.index("node_modules")])
        return [_bind_tree(prefix)]
    if os.access(path, os.X_OK) or path.suffix in SCRIPT_SUFFIXES:
        return [Bind(path.resolve(), path)]
    return []


def _base_interpreter(config: Path, writable: list[Path]) -> list[Bind]:
    """The installation a virtual environment's interpreter comes from (its `home`'s
    parent, e.g. /root/.pyenv/versions/3.12.1), unless the sandbox shows it already.

    Refused (ToolError) when a sandboxed program may have written the pyvenv.cfg
    (_programs_may_write): its `home` had bwrap, as root, show the server whatever
    directory it named at the next start (another agent's workspace, /run's sockets), and
    a server that writes its own venv starts again whenever it exits."""
    for line in config.read_text(errors="replace").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            home = Path(value.strip())
            prefix = home.parent if home.name == "bin" else home
            if prefix.is_absolute() and prefix.is_dir() and not _visible(prefix):
                if _programs_may_write(config, writable):
                    raise ToolError(
                        f"The server's virtual environment {config.parent} lies where "
                        "sandboxed programs write (a server's writable path, an agent's "
                        f"workspace), so the interpreter its pyvenv.cfg names ({home}) may "
                        "be theirs to choose, and the server was not started. An admin "
                        "must install the environment elsewhere, where only admins write."
                    )
                return [_bind_tree(prefix)]
    return []


def _programs_may_write(path: Path, writable: list[Path]) -> bool:
    """Whether a sandboxed program may have written the entry `path` (as named: a symlink
    not followed) or put it where it is: it lies in a writable path of the server or in
    the workspace root, or it or a directory above it is the sandbox user's or writable
    by it (when Harness is root; otherwise programs write as Harness, whose own files all
    are, so only what others may write counts)."""
    try:
        parent = path.parent.resolve(strict=True)
        info = os.lstat(path)
    except (OSError, RuntimeError):
        return True
    places = [*writable, Path(settings.HARNESS_WORKSPACE_ROOT).resolve()]
    if any(_inside(parent / path.name, place) for place in places):
        return True
    user = _owner()
    uid = user[0] if user is not None else -1  # (-1: no file is a program's by owner)
    group = user is not None and info.st_gid == user[1] and info.st_mode & stat.S_IWGRP
    writable_file = not stat.S_ISLNK(info.st_mode) and (info.st_mode & stat.S_IWOTH or group)
    if info.st_uid == uid or writable_file:
        return True
    try:
        for directory in (parent, *parent.parents):
            above = directory.stat()
            if _programs_may_place_in(above, info, uid, acl_of=directory):
                return True
            info = above
    except OSError:
        return True
    return False


def _bind_tree(path: Path) -> Bind:
    """A read-only bind of a directory a program needs; refused when it is or holds
    Harness's own state or a home directory."""
    source = path.resolve()
    refused = [*hidden_paths(), Path("/"), Path("/root"), Path("/home"), Path.home()]
    if any(_inside(hidden, source) for hidden in refused):
        raise ToolError(
            f"The server's program lies in {path}, which holds Harness's own state or a "
            "home directory, so it cannot be shown to the sandbox and the server was not "
            "started. An admin must install it elsewhere (a virtual environment, an npm "
            "prefix) and register that path."
        )
    return Bind(source, path)


def _visible(path: Path) -> bool:
    """Whether the sandbox shows `path` without a bind of its own (system, extras)."""
    roots = [Path(name) for name in SYSTEM_DIRS if not Path(name).is_symlink()]
    return any(_inside(path, root) for root in (*roots, *read_only_extras()))
