"""The sandbox every program a tool starts runs in (docs/security.md, "The sandbox").

`run(argv, ...)` starts one program and returns its exit code and output. With
settings.HARNESS_SANDBOX = "bwrap" the program runs under bubblewrap:

- the session workspace is the only writable directory (bound at its own path); /usr,
  the /bin and /lib links and a short list of /etc entries are read-only; nothing else of
  the host exists: not Harness's data directory, database file, Redis socket, settings
  (BASE_DIR), /home, /root, /run, /var, nor any other workspace. A hidden path that lies
  under something bound (a workspace holding var/, an extra read-only directory) is
  covered by an empty read-only tmpfs;
- private, size-limited /tmp and /dev/shm that vanish with the call; /proc/sys and the
  other writable kernel interfaces of /proc read-only, no /sys;
- new PID, IPC, UTS and cgroup namespaces, and no network unless
  settings.HARNESS_SANDBOX_NETWORK; the program is never host root: as Harness's own
  unprivileged uid (seen as 65534 in a user namespace), or, when Harness is root, as the
  sandbox user (settings.HARNESS_SANDBOX_USER, set by setpriv), with no capabilities
  and no_new_privs (a setuid `sudo` gains nothing);
- a seccomp filter (dispatcher/tools/seccomp.py) that refuses what no tool needs:
  other processes' memory, keyrings, bpf, mounts and namespaces, modules, the clock,
  set-user-ID and set-group-ID files;
- limits on CPU time, file size, core dumps and POSIX message queues (setrlimit, through
  util-linux `prlimit`; the core dump limit is 1, which no core_pattern pipe's helper runs
  for, and the program's to keep; message queues none, their bytes being per host uid),
  on processes (a pids cgroup per call where one can be made, required when Harness runs
  as root, else RLIMIT_NPROC) and on memory (a memory cgroup, else RLIMIT_AS);
- the wall-clock timeout kills the whole sandbox, and nothing in it outlives the call
  (a PID namespace, bwrap --die-with-parent: `setsid -f` children die too).

`sandbox_servers.sandboxed_argv(argv, paths)` wraps the command of a program that keeps
running (an upstream stdio MCP server) in the same sandbox; the cgroups are in
`sandbox_cgroups`, the seccomp filter in `seccomp`.

"off" (chosen explicitly; the dashboard shows it) runs the program as a plain child in
its own process group, as Harness did before the sandbox. In both modes the output is
read while it is produced: the model's share is kept, the rest only counted, and a
program that writes more than `Limits.output_bytes` is stopped, so that `yes` can fill
neither the memory nor the disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import functools
import glob
import math
import os
import re
import select
import shlex
import shutil
import signal
import stat
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from dispatcher.tools import sandbox_cgroups, sandbox_git, seccomp
from dispatcher.tools.base import ToolError
from dispatcher.tools.sandbox_cgroups import Cgroups
from dispatcher.tools.sandbox_user import SandboxUnavailable, sandbox_user

MODES = ("bwrap", "off")
SANDBOX_UID = 65534  # "nobody": the uid a program sees when Harness is not root
# Writable kernel interfaces of /proc, shown read-only (bound over themselves); /sys is
# not in the sandbox at all.
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
# A command's HOME (run_command.scrubbed_environment): an empty read-only directory of the
# sandbox's own, so no per-user file an agent wrote is read, nor one a program of the same
# command copied there; under /run, where no workspace may lie (a workspace bound under
# /tmp shows its path there). With HARNESS_SANDBOX=off, `run` gives each run a new empty
# directory instead.
HOME = "/run/home"
SECCOMP_FD = 3  # the launcher opens the filter as this descriptor for bwrap --seccomp
EXIT_REPORT = "harness: the sandboxed server exited with status"
# When Harness is root, setpriv starts, as the sandbox user, a shell that looks the program
# up as execvp would and, when it is missing or not executable, says so on EXEC_FD (a file
# only Harness reads, opened by the launcher) and exits without executing anything;
# otherwise it closes EXEC_FD and becomes the program (exec, same process). So "not found"
# is never read from the program's own output: a program that printed setpriv's "failed to
# execute" line and exited 127 was reported as missing after it ran. A lookup that passes
# and an exec that fails still (a file removed meanwhile, a missing ELF interpreter) is the
# shell's own message and status in the output, told as the program's result. A candidate
# that does not exist under a directory the sandbox user may not search is "Permission
# denied", as execve says (EACCES), not "not found" ("./private/tool" under a mode 0700
# directory read "Command ... was not found ... Check the name"). dash's `exec` takes a
# first word beginning with '-' for an option of its own (and takes no '--'): such a
# program is executed by the path the lookup found it at ("-/build" as "./-/build"), its
# argv[0] that path ("-/build", found and executable, never ran: "Illegal option -/").
EXEC_FD = 9
EXEC_SCRIPT = r"""found=$(
set -f
case $1 in
"") exit 127 ;;
*/*) set -- "$1" ;;
*) name=$1; path=${PATH-/bin:/usr/bin}; set --
   case $path in ""|*:) set -- "./$name" ;; esac
   IFS=:; for dir in $path; do set -- "$@" "${dir:-.}/$name"; done ;;
esac
seen=
for candidate in "$@"; do
  if [ -f "$candidate" ] && [ -x "$candidate" ]; then printf "%s/" "$candidate"; exit 0; fi
  if [ -e "$candidate" ]; then seen=1; continue; fi
  up=$candidate
  while case $up in */?*) true ;; *) false ;; esac; do
    up=${up%/*}
    if [ -e "$up" ]; then
      [ -d "$up" ] && ! [ -x "$up" ] && seen=1
      break
    fi
  done
done
[ -n "$seen" ] && exit 126
exit 127
)
case $? in
126) echo "Permission denied" >&9; exit 126 ;;
127) echo "No such file or directory" >&9; exit 127 ;;
esac
case $1 in -*)
  found=${found%/}; case $found in -*) found=./$found ;; esac
  shift; set -- "$found" "$@" ;;
esac
exec 9>&-
exec "$@"
"""
# The processes of the launcher with report_exit beyond those of every run (its two
# subshells and the stderr copier): the cgroup's own pids.max counts them, and left them
# out of what the server may start (253 of its 256).
EXIT_REPORT_PROCESSES = 3
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What programs need of /etc; everything else there (shadow, ssh host keys, service
# configuration with passwords, environment files) does not exist in the sandbox.
# Deployments add more with HARNESS_SANDBOX_READ_ONLY.
ETC_ENTRIES = (
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "host.conf",
    "resolv.conf",
    "gai.conf",
    "protocols",
    "services",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "locale.alias",
    "os-release",
    "debian_version",
    "alternatives",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "mime.types",
    "magic",
    "magic.mime",
    "terminfo",
    "inputrc",
    "profile",
    "profile.d",
    "bash.bashrc",
    "shells",
    "gitconfig",
    "perl",
    "python3*",
    "java-*",
)
CGROUP_PREFIX = "harness-sandbox"
BWRAP_PREFIX = b"bwrap: "


@dataclass(frozen=True)
class Limits:
    """What one run may use. `timeout` is wall-clock seconds for the whole sandbox."""

    timeout: float
    output_chars: int  # characters of output kept for the model
    cpu_seconds: int | None = None  # per process; None: the timeout, rounded up
    file_bytes: int = 1 << 30  # largest file a process may write
    processes: int = 256  # processes and threads at once
    output_bytes: int = 16 << 20  # past this much output the program is stopped
    tmp_bytes: int = 256 << 20  # size of the private /tmp (and of /dev/shm, a quarter)
    memory_bytes: int | None = None  # None: settings.HARNESS_SANDBOX_MEMORY

    @property
    def cpu(self) -> int:
        return self.cpu_seconds or max(1, math.ceil(self.timeout))

    @property
    def memory(self) -> int:
        return self.memory_bytes or memory_limit()


@dataclass(frozen=True)
class Completed:
    """A finished run: the raw exit status and the output as the model will read it."""

    returncode: int
    output: str
    sandboxed: bool
    stopped_for_output: bool = False
    stopped_for_memory: bool = False
    # Whether bwrap executed its command (its --json-status-fd said so: StartReport), None
    # when not asked. Once it did, a "bwrap: " line in the output is the program's own.
    started: bool | None = None
    # Why the program could not be executed when Harness is root ("No such file or
    # directory", "Permission denied"), as the sandbox's shell said it out of band
    # (EXEC_SCRIPT, on EXEC_FD: StartReport), never read from the output; None otherwise.
    exec_failure: str | None = None


def mode() -> str:
    return str(settings.HARNESS_SANDBOX)


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


def memory_limit() -> int:
    """settings.HARNESS_SANDBOX_MEMORY in bytes (a number, or with K, M, G or T: binary
    multiples). Raises ValueError saying what is wrong (the start-up check, E044)."""
    value = str(settings.HARNESS_SANDBOX_MEMORY)
    match = _SIZE.match(value)
    if match is None:
        raise ValueError(f"HARNESS_SANDBOX_MEMORY {value!r} is not a size such as 2G or 512M")
    size = int(match.group(1)) << (10 * " KMGT".index(match.group(2).upper() or " "))
    if size < 64 << 20:
        raise ValueError(f"HARNESS_SANDBOX_MEMORY {value!r} is below 64M; no program starts")
    return size


def hand_over(fd: int) -> None:
    """Give a file or directory the worker made in a workspace (open as `fd`) to the
    sandbox user, so that sandboxed programs can change it as they change their own.
    Nothing when Harness is not root or programs are not sandboxed."""
    user = _owner()
    if user is None:
        return
    info = os.fstat(fd)
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        return  # as in give_to_sandbox: another of its names may lie outside the workspace
    if (info.st_uid, info.st_gid) != user:
        os.fchown(fd, *user)


def give_to_sandbox(root: Path, *, root_fd: int | None = None) -> None:
    """When Harness is root: make `root` (a workspace, a writable server path) and all it
    holds belong to the sandbox user, once (the owner of `root` itself marks it done).

    Walks with descriptors and never follows a symlink (each directory opened relative to
    its parent's descriptor with O_NOFOLLOW), so a directory swapped for a symlink
    meanwhile cannot lead the walk outside; a file with more than one hard link keeps its
    owner (one of its names may lie outside `root`); Harness's own directories
    (hidden_paths: data, settings, workspace root) are neither entered nor given, wherever
    an admin put them beneath `root`. The walk keeps a stack of its own, one descriptor a
    level of the directory it is in (os.fwalk recurses once per level: a tree 1,200 deep,
    a cloned repository's or an unpacked archive's, raised RecursionError at every run).
    """
    user = _owner()
    if user is None:
        return
    top = os.fstat(root_fd) if root_fd is not None else root.lstat()
    if (top.st_uid, top.st_gid) == user:
        return
    hidden = set(hidden_paths())
    # `root_fd`: the directory is that descriptor's (open_unredirected), `root` its path
    top_fd = os.open(root if root_fd is None else ".", _WALK_FLAGS, dir_fd=root_fd)
    top_fd_path = os.open(".", _ENTRY_FLAGS, dir_fd=top_fd)  # (given last, through it)
    try:
        stack: list[_Level] = []
        try:
            stack.append(_Level(root, top_fd, iter(()), _identity(top_fd)))
            stack[0].names = iter(os.listdir(top_fd))
            while stack:
                level = stack[-1]
                if level.fd is None and not _reopen(stack):
                    continue  # it changed meanwhile: _reopen dropped it and what it held
                assert level.fd is not None
                name = next(level.names, None)
                if name is None:
                    stack.pop()
                    os.close(level.fd)
                    continue
                try:
                    # The entry judged is the one given: held by an O_PATH descriptor, looked at
                    # and given through it (a name looked up twice could be swapped in between
                    # for a file hard-linked from outside: renameat2's exchange).
                    entry = os.open(name, _ENTRY_FLAGS, dir_fd=level.fd)
                except (FileNotFoundError, NotADirectoryError):
                    continue  # gone meanwhile
                try:
                    info = os.fstat(entry)
                    if stat.S_ISLNK(info.st_mode):
                        continue  # a symlink keeps its owner (nothing of it is read or written)
                    if stat.S_ISDIR(info.st_mode) and Path(level.path, name) in hidden:
                        continue  # neither entered nor given
                    if not (stat.S_ISREG(info.st_mode) and info.st_nlink > 1):
                        _chown_held(entry, user)
                    if stat.S_ISDIR(info.st_mode):
                        child = os.open(".", _WALK_FLAGS, dir_fd=entry)
                        try:
                            listed = os.listdir(child)
                        except FileNotFoundError:  # removed meanwhile
                            os.close(child)
                            continue
                        except BaseException:
                            os.close(child)
                            raise
                        stack.append(
                            _Level(Path(level.path, name), child, iter(listed), _identity(child))
                        )
                        _close_far_levels(stack)
                finally:
                    os.close(entry)
        finally:
            for level in stack:
                if level.fd is not None:
                    os.close(level.fd)
        _chown_held(top_fd_path, user)  # last: it marks the whole tree given
    finally:
        os.close(top_fd_path)


_ENTRY_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def _chown_held(fd: int, user: tuple[int, int]) -> None:
    """Give the file `fd` holds (an O_PATH descriptor of anything but a symlink) to
    `user`: through its /proc magic link, which names that very file, never a name."""
    os.chown(f"/proc/self/fd/{fd}", *user)


_WALK_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Descriptors give_to_sandbox keeps open at once, the levels nearest the one it is in (a
# descriptor a level would run past a service's usual limit of 1024 in a tree that deep):
# a level whose descriptor was closed is opened again from the nearest open one above it,
# one name at a time with no symlink followed, and must be the same directory.
OPEN_LEVELS = 64


@dataclasses.dataclass
class _Level:
    path: Path
    fd: int | None
    names: Iterator[str]
    identity: tuple[int, int]


def _identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _close_far_levels(stack: list[_Level]) -> None:
    """Close the descriptor of the level OPEN_LEVELS above the newest (the root's stays)."""
    far = len(stack) - 1 - OPEN_LEVELS
    if far >= 1 and stack[far].fd is not None:
        os.close(stack[far].fd)  # type: ignore[arg-type]
        stack[far].fd = None


def _reopen(stack: list[_Level]) -> bool:
    """Open the newest level's directory again (and keep those of the OPEN_LEVELS levels
    nearest it open) from the nearest level still open. False, with the level that
    changed and all beneath it dropped, when one is no longer the directory it was."""
    base = max(i for i, level in enumerate(stack) if level.fd is not None)
    keep_from = len(stack) - OPEN_LEVELS
    current = stack[base].fd
    assert current is not None
    passing: int | None = None  # a descriptor opened only to reach the next level
    for i in range(base + 1, len(stack)):
        try:
            fd: int | None = os.open(stack[i].path.name, _WALK_FLAGS, dir_fd=current)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                if passing is not None:
                    os.close(passing)
                raise
            fd = None
        if fd is not None and _identity(fd) != stack[i].identity:
            os.close(fd)
            fd = None
        if passing is not None:
            os.close(passing)
            passing = None
        if fd is None:  # changed meanwhile: this level and those beneath it are not walked
            del stack[i:]
            return False
        if i >= keep_from:
            stack[i].fd = fd
        else:
            passing = fd
        current = fd
    return True


def _owner() -> tuple[int, int] | None:
    if mode() != "bwrap":
        return None
    with contextlib.suppress(SandboxUnavailable):  # no program runs then anyway
        return sandbox_user()
    return None


def confines() -> bool:
    """Whether programs run bounded: the bwrap sandbox, working here, with no network.

    What a policy needs before it lets a program it could not read run unattended.
    """
    return mode() == "bwrap" and not settings.HARNESS_SANDBOX_NETWORK and probe() is None


def run(
    argv: list[str],
    *,
    workspace: Path,
    cwd: Path,
    env: dict[str, str],
    limits: Limits,
    git: str = sandbox_git.ALL,
) -> Completed:
    """Run `argv` in `cwd` (inside `workspace`) under the configured sandbox.

    stdin is empty; stdout and stderr are combined. `git`: what of the workspace's git
    metadata that makes git run programs stays writable (sandbox_git: ALL keeps all of it
    read-only, for a command no person approved; NONE for one a reviewer approved). Raises
    ToolError when the program cannot be started (not found, not executable, the sandbox
    cannot run), TimeoutError once `limits.timeout` has passed (everything the program
    started is killed first).
    """
    if mode() == "off":
        # (no private /tmp: HOME is an empty directory made for this run alone; removed
        # as far as it can be: a program left running may still write in it, and the
        # result stands)
        with tempfile.TemporaryDirectory(
            prefix="harness-home-", ignore_cleanup_errors=True
        ) as home:
            own = {**env, "HOME": home} if env.get("HOME") == HOME else env
            return _run_process(argv, cwd=cwd, env=own, limits=limits, sandboxed=False)
    require_sandbox()
    refuse_redirected(workspace)
    # The directory checked is the one given and bound: opened one component at a time,
    # each symlink judged where it lies as it is followed (a check of the path, then a
    # resolve of it, followed a symlink a program swapped in between), then given to the
    # sandbox user and bound by that descriptor (--bind-fd).
    original = Path(os.path.abspath(workspace))
    workspace_fd = open_unredirected(original)
    try:
        workspace = Path(os.readlink(f"/proc/self/fd/{workspace_fd}"))
        inside = Path(os.path.relpath(os.path.abspath(cwd), original))
        cwd = workspace / inside if inside.parts[:1] != ("..",) else cwd.resolve()
        refuse_exposed_state(workspace)
        give_to_sandbox(workspace, root_fd=workspace_fd)
        guard = sandbox_git.guard(workspace, workspace_fd, git)
        try:
            try:
                git_binds = [Bind(e.target, e.target, e.writable, fd=e.fd) for e in guard.entries]
                with (
                    contextlib.ExitStack() as held,
                    _call_cgroups(limits) as cgroups,
                    StartReport() as report,
                ):
                    extras = hold_read_only_extras(held)
                    command = _limit_command(
                        limits, cgroups, exec_report=report.exec_path
                    ) + bwrap_command(
                        argv,
                        workspace=workspace,
                        cwd=cwd,
                        limits=limits,
                        network=bool(settings.HARNESS_SANDBOX_NETWORK),
                        extras=extras,
                        workspace_fd=workspace_fd,
                        inside=git_binds,
                        status_fd=report.fd,
                    )
                    done = _run_process(
                        command,
                        cwd=workspace,
                        env=env,
                        limits=limits,
                        sandboxed=True,
                        pass_fds=_descriptors([*git_binds, *extras], workspace_fd, report.fd),
                    )
                    done = report.told(done)
                    out_of_memory = _oom_killed(cgroups.memory)
            except BaseException:
                # A timeout (or any failure) once the program ran: what it made must go
                # too, after its cgroups are left (its processes gone); a removal that
                # fails raises its own ToolError instead.
                sandbox_git.remove_made(guard)
                raise
            # (before the start failure: what a program made must go even then)
            done = dataclasses.replace(done, output=sandbox_git.settle(guard, done.output))
        finally:
            guard.close()
    finally:
        os.close(workspace_fd)
    failure = _start_failure_line(done)
    if failure is not None:
        raise _start_failure(argv, failure)
    if out_of_memory:
        return dataclasses.replace(
            done,
            stopped_for_memory=True,
            output=done.output
            + f"\n[stopped: the program used more than {limits.memory} bytes of memory "
            "(HARNESS_SANDBOX_MEMORY) and was killed]",
        )
    return done


def _descriptors(binds: list[Bind], *more: int) -> tuple[int, ...]:
    """The descriptors to pass to bwrap: `more`, and those `binds` are bound by."""
    return (*more, *(bind.fd for bind in binds if bind.fd is not None))


def _start_failure_line(done: Completed) -> str | None:
    """The sandbox's own complaint when it could not start the program, or None: bwrap's
    first line, or the exec failure its shell told out of band (`done.exec_failure`,
    EXEC_SCRIPT: Harness is root).

    The program writes to the same output, so its own words are never taken for the
    sandbox's: a "bwrap: " line counts only while bwrap has not said it executed its
    command (`done.started`; a program that printed one and exited 1 had its output
    dropped and the call reported as "Nothing ran" after it ran), and no line of the
    output ever says the program was missing (a program that printed setpriv's "failed
    to execute ...: No such file or directory" and exited 127 was reported "not found"
    after it ran)."""
    if done.exec_failure is not None:
        return f"{EXEC_FAILED}{done.exec_failure}"
    first = done.output.split("\n", 1)[0]
    if done.returncode == 1 and first.startswith(BWRAP_PREFIX.decode()):
        return first if done.started is not True else None
    return None


EXEC_FAILED = "sandbox: failed to execute the command: "


class StartReport:
    """What bwrap says of the start through --json-status-fd: it writes `exit-code` once
    the command it executed (setpriv, or the program) ends, and only if that command was
    executed (a CLOEXEC pipe of its own tells it; nothing after a failed setup or exec).
    The program never holds the descriptor (bwrap closes it in the sandbox). A context
    manager: `fd` (10 or above) is to be passed to bwrap; `started()` once it has ended.

    When Harness is root, bwrap executes setpriv, whose own failure to execute the
    program bwrap never sees: a file of Harness's own (mode 0600, outside the sandbox),
    unlinked as soon as it is made and held by this process alone, is what the launcher
    opens as EXEC_FD for the sandbox's shell to say so (EXEC_SCRIPT;
    `_limit_command(exec_report=...)`), through `exec_path`, this process's
    /proc/<pid>/fd/<n> link, which names that very file and no name in a directory: opened
    by its name in the temporary directory, as root and following symlinks, a name
    swapped there meanwhile (a TMPDIR another uid may write) had the launcher append to
    whatever file it named and hand it, writable, to the sandbox's shell, and the failure
    went unread. Nothing of it outlives the call, even a worker killed meanwhile.
    `exec_failure()` reads it. None when Harness is not root (bwrap executes the program
    itself)."""

    def __init__(self) -> None:
        self._read = -1
        self.fd = -1
        self._exec = -1
        self.exec_path: Path | None = None

    def __enter__(self) -> StartReport:
        self._read, write = os.pipe()  # (both close-on-exec; only the copy is passed)
        os.set_blocking(self._read, False)
        try:
            self.fd = fcntl.fcntl(write, fcntl.F_DUPFD_CLOEXEC, 10)
        finally:
            os.close(write)
        if _owner() is not None:
            try:
                self._exec, name = tempfile.mkstemp(prefix="harness-exec-")
                os.unlink(name)
            except BaseException:
                self.__exit__()
                raise
            self.exec_path = Path(f"/proc/{os.getpid()}/fd/{self._exec}")
        return self

    def __exit__(self, *_: object) -> None:
        for fd in (self.fd, self._read, self._exec):
            if fd >= 0:
                os.close(fd)
        self.fd = self._read = self._exec = -1
        self.exec_path = None

    def told(self, done: Completed) -> Completed:
        """`done` with what the sandbox told of the start (read once bwrap has exited)."""
        return dataclasses.replace(done, started=self.started(), exec_failure=self.exec_failure())

    def exec_failure(self) -> str | None:
        """Why the sandbox's shell did not execute the program, or None (it did, or
        Harness is not root)."""
        if self._exec < 0:
            return None
        said = os.pread(self._exec, 256, 0).decode(errors="replace").strip()
        return said if said in ("No such file or directory", "Permission denied") else None

    def started(self) -> bool:
        """Whether bwrap executed its command (read once bwrap has exited)."""
        said = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self._read, 4096):
                said += chunk
                if len(said) > 65536:
                    break
        return b'"exit-code"' in said


def require_sandbox() -> None:
    """Raise SandboxUnavailable unless the bwrap sandbox is configured and works here."""
    current = mode()
    if current != "bwrap":
        raise SandboxUnavailable(
            f"HARNESS_SANDBOX is {current!r}, which is not a sandbox Harness knows, so no "
            "program runs. An operator must set HARNESS_SANDBOX to 'bwrap' (or 'off')."
        )
    problem = _probe_now()  # (OutOfDescriptors: its own message, no operator's fault)
    if problem is not None:
        raise SandboxUnavailable(
            f"The sandbox cannot run on this host ({problem}), so no program runs. An "
            "operator must fix it (see docs/security.md, 'Sandbox')."
        )


# No workspace lies inside these: it would be bound writable and, when Harness is root,
# given to the sandbox user (/etc/profile.d runs for every login, /usr/local/bin is on
# every PATH, /root/.ssh lets in). Inside /home a person's own project is a workspace;
# inside /root only Harness's own workspace root is (a checkout under /root keeps it).
SYSTEM_TREES = (
    *SYSTEM_DIRS,
    "/etc",
    "/boot",
    "/proc",
    "/sys",
    "/dev",
    "/root",
    "/run",  # sockets and pid files of running services (/var/run leads here)
    *("/var/lib", "/var/spool", "/var/log", "/var/mail", "/var/cache", "/var/backups"),
)


def system_tree_of(workspace: Path) -> str | None:
    """The system directory `workspace` (resolved) lies inside, or None."""
    own = Path(settings.HARNESS_WORKSPACE_ROOT).resolve()
    for tree in SYSTEM_TREES:
        if not _inside(workspace, Path(tree)):
            continue
        if _inside(workspace, own):  # e.g. a checkout in /root, data in /var/lib/harness
            continue
        return tree
    return None


def exposed_state(workspace: Path) -> str | None:
    """Why `workspace` (resolved) may not be bound writable into the sandbox, or None: it
    is one of Harness's hidden directories or holds one below its own entries, holds the
    system itself (`/`, `/usr`, `/etc`, `/var`: any of SYSTEM_TREES) or every home
    directory (`/home`, `/root`), or lies inside a system directory (SYSTEM_TREES). Each
    would be written by programs (and, when Harness is root, given to the sandbox user).
    Nor may it lie in HOME (sandbox.HOME)."""
    reason = system_problem(workspace)
    if reason is not None:
        return reason
    # (Harness's own workspace root is let inside /run: not inside HOME, where programs
    # read their per-user files, .config/pip/pip.conf of a workspace named `pip`, say)
    if _inside(workspace, Path(HOME)):
        return (
            f"lies in {HOME}, the directory programs get as HOME, where they read their "
            "per-user configuration (the agent would write it)"
        )
    for hidden in hidden_paths():
        if workspace == hidden:
            return (
                "is one of Harness's own directories (data, settings or workspace root), "
                "which programs may never see"
            )
        # Deeper than a workspace's own entries, the tmpfs that hides it covers a path, not
        # a directory: the program renames a parent it owns (var/ of var/data), and the
        # next run shows the data under the new name. A direct entry is a mount point the
        # program cannot rename or remove.
        if _inside(hidden, workspace) and hidden.parent != workspace:
            return (
                f"holds Harness's own directories ({hidden}: data, settings or workspace "
                "root), which programs may never see"
            )
    return None


def system_problem(path: Path) -> str | None:
    """Why `path` (resolved) may not be given to the sandbox user to write, or None: it
    holds a system tree or every home directory, or lies inside a system tree. The rule
    for a workspace (exposed_state) and for a server's writable path (sandbox_servers)."""
    # Every system tree, not only /usr and /etc: `/var` holds /var/lib and /var/spool.
    if any(_inside(Path(system), path) for system in (*SYSTEM_TREES, "/home")):
        return "holds system or home directories, which programs may not write"
    tree = system_tree_of(path)
    if tree is not None:
        return f"lies inside the system directory {tree}, which programs may not write"
    return None


def refuse_exposed_state(workspace: Path) -> None:
    """Raise ToolError for a workspace `exposed_state` refuses: no program runs in it."""
    reason = exposed_state(workspace)
    if reason is not None:
        raise ToolError(
            f"The session workspace {workspace} {reason}, so no program runs. An operator "
            "must give the agent a workspace of its own."
        )


def redirection(path: Path) -> str | None:
    """Why `path` (absolute, as configured: an agent's workspace is stored resolved) may
    lead where a sandboxed program pointed it, or None: a symlink on it that lies in a
    directory sandboxed programs may write. A workspace nested in another agent's is such
    a directory's entry: that agent's program replaces it with a symlink to a person's
    home or an application's directory, and the next run would give that tree to the
    sandbox user and bind it writable. Symlinks an admin made (in directories programs
    cannot write) are followed."""
    uid = _program_uid()
    current = Path("/")
    for part in Path(os.path.abspath(path)).parts[1:]:
        entry = current / part
        try:
            info = entry.lstat()
        except OSError:
            return None  # missing: nothing leads anywhere yet (the caller makes or refuses it)
        if not stat.S_ISLNK(info.st_mode):
            current = entry
            continue
        if _programs_may_place(current, info, uid):
            return (
                f"reaches {entry}, a symlink in a directory sandboxed programs may write "
                "(another agent's workspace, say), so a program may have pointed it "
                "elsewhere"
            )
        current = Path(os.path.realpath(entry))
    return None


def _program_uid() -> int:
    """The host uid sandboxed programs write as: the sandbox user's, or Harness's own."""
    user = _owner()
    return user[0] if user is not None else os.geteuid()


def _program_groups() -> set[int]:
    """The host groups sandboxed programs write as: the sandbox user's (setpriv clears
    the others), or Harness's own, supplementary ones included (a user namespace keeps
    them: bwrap maps none, and the kernel still grants what they may write)."""
    user = _owner()
    if user is not None:
        return {user[1]}
    return {os.getegid(), *os.getgroups()}


def _programs_may_place(directory: Path, link: os.stat_result, uid: int) -> bool:
    """Whether a program writing as `uid` may have put the symlink `link` in `directory`."""
    try:
        info = directory.stat()
    except OSError:
        return True
    return _programs_may_place_in(info, link, uid, acl_of=directory)


def _programs_may_place_in(
    info: os.stat_result, link: os.stat_result, uid: int, *, acl_of: Path | int
) -> bool:
    """`_programs_may_place` for the directory whose status is `info`, whose access ACL
    is read from `acl_of` (its path, or an O_PATH descriptor of it)."""
    if info.st_uid == uid:
        return True
    groups = _program_groups()
    group_writable = info.st_mode & stat.S_IWGRP and info.st_gid in groups
    if not (
        info.st_mode & stat.S_IWOTH or group_writable or _acl_grants_write(acl_of, uid, groups)
    ):
        return False
    # in a sticky directory (/tmp) only an entry's owner may replace it
    return not info.st_mode & stat.S_ISVTX or link.st_uid == uid


# A POSIX access ACL as the kernel stores it (system.posix_acl_access): a version, then
# (tag, permissions, id) entries.
ACL_XATTR = "system.posix_acl_access"
ACL_USER, ACL_GROUP, ACL_MASK = 0x02, 0x08, 0x10
ACL_WRITE = 0x02


def _acl_grants_write(where: Path | int, uid: int, groups: set[int]) -> bool:
    """Whether the access ACL of `where` (a path, or an O_PATH descriptor) names `uid` or
    one of `groups` with write permission the mask lets through. The mode bits show only
    the owner, the mask and others: an admin who shared a directory with Harness's user
    (or the sandbox user) by setfacl gave programs what a group-writable mode would. An
    ACL that cannot be read counts as granting it, unless the filesystem has none."""
    path = f"/proc/self/fd/{where}" if isinstance(where, int) else os.fspath(where)
    try:
        acl = os.getxattr(path, ACL_XATTR)
    except OSError as error:
        return error.errno not in (errno.ENODATA, errno.EOPNOTSUPP, errno.ENOENT)
    if len(acl) < 4 or (len(acl) - 4) % 8:
        return True
    entries = [struct.unpack_from("<HHI", acl, offset) for offset in range(4, len(acl), 8)]
    mask = next((perm for tag, perm, _ in entries if tag == ACL_MASK), ACL_WRITE)
    return any(
        perm & mask & ACL_WRITE
        and ((tag == ACL_USER and ident == uid) or (tag == ACL_GROUP and ident in groups))
        for tag, perm, ident in entries
    )


def refuse_redirected(workspace: Path) -> None:
    """Raise ToolError for a workspace `redirection` refuses: no program runs in it."""
    reason = redirection(workspace)
    if reason is not None:
        raise ToolError(
            f"The session workspace {workspace} {reason}, so no program runs. An operator "
            "must look at it (and not nest one agent's workspace in another's)."
        )


def open_directory(path: Path) -> int:
    """An O_PATH descriptor of the directory `path` (absolute, resolved), opened one
    component at a time from / without following any symlink, numbered 10 or above (the
    launcher opens the seccomp filter as descriptor 3). Raises ToolError when a component
    is a symlink now: it changed since it was resolved and checked."""
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    current = os.open("/", flags)
    try:
        for part in path.parts[1:]:
            try:
                following = os.open(part, flags, dir_fd=current)
            except OSError as error:
                raise ToolError(
                    f"The session workspace {path} changed while the sandbox was being set "
                    f"up ({part!r}: {error.strerror}; a symlink may stand there now), so no "
                    "program runs. Try again; an operator must look at it if it persists."
                ) from None
            os.close(current)
            current = following
        return fcntl.fcntl(current, fcntl.F_DUPFD_CLOEXEC, 10)
    finally:
        os.close(current)


def open_unredirected(path: Path, *, file_ok: bool = False) -> int:
    """An O_PATH descriptor of the directory `path` (absolute), numbered 10 or above,
    opened one component at a time from / with no symlink followed blindly: a symlink is
    followed only where `_programs_may_place` says no program could have put it (its
    directory, as opened, is not theirs to write), else ToolError (as refuse_redirected).
    Each directory is held by descriptor once opened, so nothing swapped in after it was
    judged is followed. With `file_ok` the last component may be a file (a server's
    read-only path)."""
    uid = _program_uid()
    here = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    current = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    parts = list(path.parts[1:])
    hops = 0
    try:
        while parts:
            part = parts.pop(0)
            if part in ("", "."):
                continue
            try:
                following = os.open(part, here, dir_fd=current)
                info = os.fstat(following)
            except OSError as error:
                raise _changed_workspace(path, part, error.strerror) from None
            if stat.S_ISLNK(info.st_mode):
                try:  # the link judged, read by its descriptor (its name may be another's now)
                    target = os.readlink("", dir_fd=following)
                finally:
                    os.close(following)
                hops += 1
                if hops > 40 or _programs_may_place_in(
                    os.fstat(current), info, uid, acl_of=current
                ):
                    raise ToolError(
                        f"The session workspace {path} reaches {part!r}, a symlink in a "
                        "directory sandboxed programs may write (another agent's workspace, "
                        "say), so a program may have pointed it elsewhere, so no program "
                        "runs. An operator must look at it (and not nest one agent's "
                        "workspace in another's)."
                    )
                if target.startswith("/"):
                    os.close(current)
                    current = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                parts = [p for p in Path(target).parts if p != "/"] + parts
                continue
            if not stat.S_ISDIR(info.st_mode) and not (file_ok and not parts):
                os.close(following)
                raise _changed_workspace(path, part, "not a directory")
            os.close(current)
            current = following
        return fcntl.fcntl(current, fcntl.F_DUPFD_CLOEXEC, 10)
    finally:
        os.close(current)


def _changed_workspace(path: Path, part: str, why: str | None) -> ToolError:
    return ToolError(
        f"The session workspace {path} changed while the sandbox was being set up "
        f"({part!r}: {why}; a symlink may stand there now), so no program runs. Try "
        "again; an operator must look at it if it persists."
    )


def _start_failure(argv: list[str], line: str) -> ToolError:
    execute = line.startswith(("bwrap: execvp ", EXEC_FAILED))
    if execute and line.endswith("No such file or directory"):
        return ToolError(
            f"Command '{argv[0]}' was not found in the sandbox (it holds the workspace, /usr "
            "and a few system files, nothing else of the host). Check the name, or run "
            "['sh', '-c', 'command -v NAME'] to see what is installed."
        )
    if execute and line.endswith("Permission denied"):
        return ToolError(f"Command '{argv[0]}' is not executable: Permission denied.")
    return SandboxUnavailable(
        f"The sandbox could not start the command ({line.removeprefix('bwrap: ')}). "
        "Nothing ran; an operator must look at the sandbox configuration."
    )


# --- The command line ---------------------------------------------------------------------


@dataclass(frozen=True)
class Bind:
    """A host path shown in the sandbox: `source` on the host (resolved), at `target`."""

    source: Path
    target: Path
    writable: bool = False
    fd: int | None = None  # bound by this open descriptor of `source` (--bind-fd)

    def args(self) -> list[str]:
        if self.fd is not None:
            return [
                "--bind-fd" if self.writable else "--ro-bind-fd",
                str(self.fd),
                str(self.target),
            ]
        flag = "--bind" if self.writable else "--ro-bind"
        return [flag, str(self.source), str(self.target)]


def bwrap_command(
    argv: list[str],
    *,
    workspace: Path,
    cwd: Path,
    limits: Limits,
    network: bool,
    extras: list[Bind],
    workspace_fd: int | None = None,
    inside: list[Bind] | None = None,
    status_fd: int | None = None,
) -> list[str]:
    """The bubblewrap command line that runs `argv` (see the module docstring); the
    workspace bound by `workspace_fd` (open_directory, passed to bwrap) when given,
    `inside` over it (sandbox_git's binds of the git metadata), and `extras`
    (hold_read_only_extras: pass their descriptors too); bwrap's status on `status_fd`
    (StartReport) when given."""
    writable = Bind(workspace, workspace, writable=True, fd=workspace_fd)
    binds = [writable, *(inside or [])]
    return sandbox_command(
        argv,
        binds=binds,
        cwd=cwd,
        limits=limits,
        network=network,
        extras=extras,
        status_fd=status_fd,
    )


def sandbox_command(
    argv: list[str],
    *,
    binds: list[Bind],
    cwd: Path,
    limits: Limits,
    network: bool,
    extras: list[Bind],
    status_fd: int | None = None,
) -> list[str]:
    """The bubblewrap command line that runs `argv` with `binds` and `extras` (the
    HARNESS_SANDBOX_READ_ONLY entries, hold_read_only_extras) besides the system's as the
    only host paths it sees. It expects the seccomp filter open as descriptor SECCOMP_FD
    (see _limit_command), the descriptors of binds that have one passed, and
    `status_fd` (a StartReport's) passed when given.

    When Harness is root, bwrap runs as root (so it can bind what only root may reach, a
    virtual environment under /root say) without a user namespace, and the program is
    started by setpriv as the sandbox user: host uid and gid unprivileged, no
    supplementary groups, no capabilities, no_new_privs. Otherwise bwrap runs as Harness
    (unprivileged) and maps it to 65534 in a user namespace of its own.
    """
    user = sandbox_user()
    command = [_binary("bwrap") or "bwrap", *_identity_args(user)]
    command += [
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--hostname",
        "sandbox",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
    ]
    if not network:
        command.append("--unshare-net")
    if status_fd is not None:
        command += ["--json-status-fd", str(status_fd)]
    command += ["--seccomp", str(SECCOMP_FD)]
    # The sandbox's own mounts first: a host path bound later may lie under /tmp.
    command += ["--proc", "/proc"]
    for name in PROC_READ_ONLY:
        command += ["--ro-bind-try", f"/proc/{name}", f"/proc/{name}"]
    command += ["--dev", "/dev"]
    command += ["--perms", "1777", "--size", str(limits.tmp_bytes), "--tmpfs", "/tmp"]  # noqa: S108
    # HOME: empty and read-only (the root is remounted so at the end), never a tmpfs the
    # program writes: a per-user file copied there by one program of a command (`cp -r
    # dot/. /run/home/`, allowed as cp) was read by the next (`hg status`, its hooks).
    command += ["--perms", "0555", "--dir", HOME]
    shm = str(max(4096, limits.tmp_bytes // 4))
    command += ["--perms", "1777", "--size", shm, "--tmpfs", "/dev/shm"]  # noqa: S108
    command += _var_tmp(binds, limits)
    system_args, system_bound = _system_binds()
    command += system_args
    for bind in binds:
        entry = read_only_entry_holding(bind.source) if bind.writable else None
        if entry is not None:
            raise ToolError(
                f"{bind.source}, where this program may write, lies in the "
                f"HARNESS_SANDBOX_READ_ONLY entry {entry}, which every sandboxed program "
                "reads, so no program runs. An operator must list only paths where admins "
                "alone write (not one holding an agent's workspace or a server's writable path)."
            )
    covered, mounts = _mounts([*extras, *binds], system_bound)
    command += mounts
    for path in covered:
        command += ["--remount-ro", str(path)]
    command += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", str(cwd), "--"]
    if user is not None and status_fd is not None:  # (the launcher opened EXEC_FD)
        argv = ["/bin/sh", "-c", EXEC_SCRIPT, "sh", *argv]
    return command + _as_user(user, argv)


def _identity_args(user: tuple[int, int] | None) -> list[str]:
    if user is None:
        uid = str(SANDBOX_UID)
        return ["--unshare-user", "--uid", uid, "--gid", uid, "--disable-userns"]
    # setpriv needs these two to change uid and gid, and drops them (and all else) itself
    return ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]


def _as_user(user: tuple[int, int] | None, argv: list[str]) -> list[str]:
    if user is None:
        return argv
    uid, gid = user
    return [
        "/usr/bin/setpriv",
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
        *argv,
    ]


def _var_tmp(binds: list[Bind], limits: Limits) -> list[str]:
    """/var/tmp: a link to the private /tmp, or, when something is bound beneath it (a
    server's path), a private tmpfs of its own with the bind where the program expects
    it (a bind through the link would land in /tmp, not where the program looks)."""  # noqa: S108
    var_tmp = Path("/var/tmp")  # noqa: S108
    if any(_inside(bind.target, var_tmp) for bind in binds):
        size = str(limits.tmp_bytes)
        return ["--dir", "/var", "--perms", "1777", "--size", size, "--tmpfs", str(var_tmp)]
    return ["--dir", "/var", "--symlink", "/tmp", str(var_tmp)]  # noqa: S108


def _mounts(binds: list[Bind], system_bound: tuple[Path, ...]) -> tuple[list[Path], list[str]]:
    """The binds, and an empty tmpfs over each hidden path that lies beneath something
    bound, ordered parents first (a workspace inside the covered workspace root is bound
    after the cover). Returns (the covers' sandbox paths, the arguments)."""
    hidden = [path for path in hidden_paths() if path.exists()]
    seen = [*((root, root) for root in system_bound), *((b.source, b.target) for b in binds)]
    covers: set[Path] = set()
    for source, target in seen:
        for path in hidden:
            if _inside(path, source):
                covers.add(target / path.relative_to(source))
    steps: list[tuple[int, int, list[str]]] = [(len(b.target.parts), 0, b.args()) for b in binds]
    steps += [(len(path.parts), 1, ["--size", "4096", "--tmpfs", str(path)]) for path in covers]
    inside_binds = [*system_bound, *(b.target for b in binds)]
    for parent in _parents([b.target for b in binds], inside_binds):
        steps.append((len(parent.parts), -1, ["--perms", "0755", "--dir", str(parent)]))
    steps.sort(key=lambda step: step[:2])
    return sorted(covers), [arg for _, _, args in steps for arg in args]


# Made by the sandbox itself before any bind (mode and all): never made again.
OWN_MOUNTS = tuple(Path(p) for p in ("/", "/proc", "/dev", "/tmp", "/var", "/var/tmp", HOME))  # noqa: S108


def _parents(targets: list[Path], bound: list[Path]) -> list[Path]:
    """The directories above `targets` that the sandbox must make, parents first: bwrap
    would make them mode 0700 as root, which the sandbox user could not pass through.
    Directories inside something bound exist already (they are the host's)."""
    parents: dict[Path, None] = {}
    for target in targets:
        for parent in reversed(target.parents):
            if any(_inside(parent, root) for root in bound):
                break
            if parent not in OWN_MOUNTS:
                parents[parent] = None
    return list(parents)


@functools.cache
def _system_binds() -> tuple[tuple[str, ...], tuple[Path, ...]]:
    """The read-only system binds (arguments, host paths bound); read once per process."""
    command: list[str] = []
    bound: list[Path] = []
    for name in SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():
            command += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            command += ["--ro-bind", name, name]
            bound.append(path)
    entries = list(_etc_entries())
    for parent in _parents(entries, bound):
        command += ["--perms", "0755", "--dir", str(parent)]
    for entry in entries:
        if entry.is_symlink() and _inside(entry.resolve(), Path("/usr")):
            command += ["--symlink", os.readlink(entry), str(entry)]
        else:
            command += ["--ro-bind-try", str(entry), str(entry)]
            bound.append(entry.resolve())
    command += ["--symlink", "../proc/self/mounts", "/etc/mtab"]
    return tuple(command), tuple(bound)


def _etc_entries() -> Iterator[Path]:
    for name in ETC_ENTRIES:
        for match in sorted(glob.glob(f"/etc/{name}")):
            yield Path(match)


def read_only_extras() -> list[Path]:
    """settings.HARNESS_SANDBOX_READ_ONLY: more host paths programs may read, as the
    kernel resolves them now; an entry that is missing, or that read_only_problem refuses,
    is left out (no program runs while one is refused: hold_read_only_extras)."""
    with contextlib.ExitStack() as held:
        return [bind.source for bind in _judged_read_only_entries(held)[0]]


def hold_read_only_extras(held: contextlib.ExitStack) -> list[Bind]:
    """The HARNESS_SANDBOX_READ_ONLY entries the sandbox binds: each held by the O_PATH
    descriptor of what was judged (numbered 10 or above; `held` closes it) and bound by
    it (--ro-bind-fd), so that what bwrap mounts is what was judged, whatever a path on
    its way leads to by then; pass the descriptors to bwrap. A missing entry is not bound
    (as --ro-bind-try). Raises ToolError while an entry is one read_only_problem refuses
    (an absolute one: a relative entry is E043's)."""
    extras, problem = _judged_read_only_entries(held)
    if problem is not None:
        raise ToolError(
            f"{problem}, so no program runs. An operator must list only paths where admins "
            "alone write."
        )
    return extras


def _judged_read_only_entries(held: contextlib.ExitStack) -> tuple[list[Bind], str | None]:
    """Each HARNESS_SANDBOX_READ_ONLY entry judged once, through the descriptor of what it
    leads to (_judge_read_only_entry): (the binds of those it lets through that exist,
    each by its descriptor, which `held` closes; the first absolute one it refuses, as
    "HARNESS_SANDBOX_READ_ONLY entry ENTRY PROBLEM", or None). A relative entry is left
    out and named by no problem here (E043 names it)."""
    extras: list[Bind] = []
    first: str | None = None
    for entry in getattr(settings, "HARNESS_SANDBOX_READ_ONLY", []):
        found, problem = _judge_read_only_entry(entry)
        if found is not None:
            fd, path = found
            held.callback(os.close, fd)
            extras.append(Bind(path, path, fd=fd))
        elif problem is not None and first is None and entry.startswith("/"):
            first = f"HARNESS_SANDBOX_READ_ONLY entry {entry} {problem}"
    return extras, first


def _held_path(fd: int) -> Path:
    """Where the file or directory held as `fd` lies now, as the kernel names it."""
    return Path(os.readlink(f"/proc/self/fd/{fd}"))


def read_only_way_in(place: Path) -> str | None:
    """The first HARNESS_SANDBOX_READ_ONLY entry (absolute) any step of whose way lies
    in `place` (resolved), with that step: "ENTRY (at STEP)", or None. What a server's
    writable path may not hold (sandbox_servers): its server would write there, and
    could rename or replace a step of the way whenever it liked."""
    for entry in getattr(settings, "HARNESS_SANDBOX_READ_ONLY", []):
        if not entry.startswith("/"):
            continue
        found, step = _hold_way(Path(entry), places=(place,))
        if found is not None:
            os.close(found[0])
        if step is not None and _inside(step, place):
            return f"{entry} (at {step})"
    return None


def read_only_problem(entry: str) -> str | None:
    """Why the HARNESS_SANDBOX_READ_ONLY entry `entry` may not be bound, or None (see
    _judge_read_only_entry)."""
    found, problem = _judge_read_only_entry(entry)
    if found is not None:
        os.close(found[0])
    return problem


def _judge_read_only_entry(entry: str) -> tuple[tuple[int, Path] | None, str | None]:
    """(the O_PATH descriptor of what `entry` leads to and its path as walked, or None;
    why it may not be bound, or None). A missing entry is (None, None): nothing is bound
    there.

    Bound at every run by bwrap as Harness's user, root or not, an entry shows every
    sandboxed program what it holds. It is walked one step at a time from /, each step
    held by a descriptor and judged through it (_hold_way), and bound by the descriptor
    of the last: a step swapped after it was judged (a check of a path, then bwrap's own
    walk of it) changes nothing bound. Refused: a step (an entry, a symlink or directory
    on the way) that lies where sandboxed programs write (an agent's workspace, a
    server's writable path, a directory the sandbox user owns, or Harness's own user when
    Harness is not root), which was theirs to redirect; an entry that is itself theirs to
    write (a workspace, a server's writable path: what one agent's program wrote every
    other agent's program read, and ran); an entry inside Harness's own state (what lies
    beneath a bind is covered, not what it lies in); and the kernel's or the sandbox's
    own directories."""
    if not entry.startswith("/"):
        return None, "is not an absolute path"
    # When Harness is not root, programs write as Harness's own uid and groups wherever
    # they are given to write (a workspace, a server's writable path, which may lie
    # anywhere Harness may write), so everything Harness may write counts, its own
    # toolchains too: an agent's program pointed a symlink on such an entry's way at
    # another agent's workspace, or Harness's home, and every later run showed it.
    found, placed = _hold_way(Path(entry))
    if placed is not None:
        return None, f"reaches {placed}, which lies in a directory sandboxed programs may write"
    if found is None:
        return None, None
    try:
        problem = _held_entry_problem(*found)
    except BaseException:
        os.close(found[0])
        raise
    if problem is not None:
        os.close(found[0])
        return None, problem
    return found, None


def _held_entry_problem(fd: int, walked: Path) -> str | None:
    """Why the entry held as `fd`, reached as `walked` (judged on its way already), may
    not be bound, or None. Where it lies is judged as walked (where the sandbox shows
    it) and as the kernel names it now (where bwrap finds it)."""
    now = _held_path(fd)
    if not now.is_absolute():  # (not reachable from this process's root)
        return f"leads to {now}, which is not a path on this host"
    for resolved in dict.fromkeys((walked, now)):
        for hidden in hidden_paths():
            if _inside(resolved, hidden):
                return f"lies in {hidden}, Harness's own state"
        # Bound after the sandbox's own /proc, /dev and /tmp, an entry holding one
        # replaced it with the host's: "/proc" (or "/") showed every host process's
        # command line, other agents' commands among them, and "/" the whole host. The
        # kernel's and the sockets' directories are refused as a server's paths are.
        for kernel in HOST_ONLY_DIRS:
            if _inside(resolved, Path(kernel)):
                return f"lies in {kernel}, a kernel or socket directory of the host"
        for own in (*OWN_MOUNTS, *(Path(p) for p in HOST_ONLY_DIRS)):
            if _inside(own, resolved):
                return f"holds {own}, which the sandbox has of its own or not at all"
    mounted = _host_only_mount_in(now)
    if mounted is not None:
        return mounted
    if _programs_may_write(fd):
        return f"leads to {walked}, which sandboxed programs may write"
    return None


# Filesystems of the kernel's own (what /proc, /sys and /dev hold): never shown, wherever
# they are mounted.
KERNEL_FILESYSTEMS = frozenset(
    (
        "proc",
        "sysfs",
        "devtmpfs",
        "devpts",
        "mqueue",
        "cgroup",
        "cgroup2",
        "securityfs",
        "debugfs",
        "tracefs",
        "bpf",
        "configfs",
        "fusectl",
        "pstore",
        "efivarfs",
        "binfmt_misc",
        "selinuxfs",
        "nsfs",
        "rpc_pipefs",
    )
)


def _host_only_mount_in(entry: Path) -> str | None:
    """Why the entry `entry` (as the kernel names it) may not be bound for what is
    mounted beneath it, or None: bwrap binds an entry with every mount in it, and a
    directory holding a mount of the kernel's own filesystems (a build chroot's `proc`,
    mounted there by schroot) or of the host's /proc, /sys, /dev or /run (a bind of
    /run's sockets) showed the host's through it: every host process's command line,
    other agents' commands among them. Judged from /proc/self/mountinfo; one that cannot
    be read counts as such a mount."""
    try:
        lines = Path("/proc/self/mountinfo").read_text(errors="replace").splitlines()
    except OSError as error:
        if error.errno in NO_DESCRIPTORS:
            raise OutOfDescriptors(entry, error) from error
        return "holds mounts that cannot be read (/proc/self/mountinfo)"
    mounts: list[tuple[Path, str, str]] = []  # (mount point, device, filesystem)
    for line in lines:
        fields, _, tail = line.partition(" - ")
        words = fields.split()
        if len(words) < 5 or not tail:
            return "holds mounts that cannot be read (/proc/self/mountinfo)"
        point = Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), words[4]))
        mounts.append((point, words[2], tail.split()[0]))
    # (a tmpfs is told by its device, its own: a disk's is shared by every bind of it,
    # and a file of it bound in /dev, Kubernetes' /dev/termination-log, says nothing)
    host_only = {
        device
        for point, device, filesystem in mounts
        if filesystem == "tmpfs"
        and any(_inside(point, Path(directory)) for directory in HOST_ONLY_DIRS)
    }
    for point, device, filesystem in mounts:
        if point == entry or not _inside(point, entry):
            continue
        if filesystem in KERNEL_FILESYSTEMS:
            return f"holds {point}, a mount of the host's {filesystem}"
        if device in host_only:
            return f"holds {point}, a mount of the host's kernel or socket directories"
    return None


def _programs_may_write(fd: int) -> bool:
    """Whether sandboxed programs may write the file or directory held as `fd`: theirs
    (the sandbox user's, or Harness's own when it is not root), or writable by them
    through its mode (others, or their group) or an access ACL."""
    info = os.fstat(fd)
    uid, groups = _program_uid(), _program_groups()
    return bool(
        info.st_uid == uid
        or info.st_mode & stat.S_IWOTH
        or (info.st_mode & stat.S_IWGRP and info.st_gid in groups)
        or _acl_grants_write(fd, uid, groups)
    )


# The host's kernel and socket directories: never bound, whatever is configured.
HOST_ONLY_DIRS = ("/proc", "/sys", "/dev", "/run")
MAX_SYMLINK_HOPS = 40  # (the kernel's own bound)
_STEP_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
NO_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class OutOfDescriptors(SandboxUnavailable):
    """Harness had no file descriptor left (EMFILE, ENFILE) while it walked a
    HARNESS_SANDBOX_READ_ONLY entry, one O_PATH descriptor a step: nothing ran (fail
    closed), and neither the entry nor the command is to blame. Before, the step that
    could not be opened was taken for one a sandboxed program may have placed, and the
    message had the operator look for a writable directory in a sound entry."""

    def __init__(self, entry: Path, error: OSError) -> None:
        which = "this process" if error.errno == errno.EMFILE else "the whole host"
        super().__init__(
            f"Harness ran out of file descriptors ({which} has none left: "
            f"{errno.errorcode.get(error.errno or 0, '?')}) while it checked the "
            f"HARNESS_SANDBOX_READ_ONLY entry {entry}, so no program runs. Neither the "
            "entry nor the command is at fault: try again. If it recurs, an operator "
            "should raise Harness's open-file limit (RLIMIT_NOFILE, `ulimit -n`) or find "
            "what holds so many descriptors."
        )


def _hold_way(
    path: Path, places: tuple[Path, ...] = ()
) -> tuple[tuple[int, Path] | None, Path | None]:
    """`_walk_way`; raises OutOfDescriptors when Harness has no descriptor left for a
    step (an unsure step is otherwise taken for one a program placed: the entry would
    be blamed for the host's shortage)."""
    try:
        return _walk_way(path, places)
    except OSError as error:
        if error.errno in NO_DESCRIPTORS:
            raise OutOfDescriptors(path, error) from error
        raise


def _walk_way(
    path: Path, places: tuple[Path, ...] = ()
) -> tuple[tuple[int, Path] | None, Path | None]:
    """Walk to `path` as the kernel does, one step at a time from /, each directory held
    by an O_PATH descriptor and each step judged through the descriptor of the directory
    it lies in (a symlink read by its own descriptor, its target walked on from there):
    ((the descriptor of what `path` leads to, numbered 10 or above, the caller's to
    close, and its path as walked), or None when it is missing; None), or (None, the
    first step on the way that a sandboxed program may have put or may put where it is,
    or that lies in one of `places`, where programs will write). A missing entry a
    program cannot make ends the walk: nothing is bound there."""
    uid = _program_uid()
    parts = list(path.parts[1:])
    current = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    where = Path("/")
    hops = 0
    try:
        while parts:
            part = parts.pop(0)
            if part in ("", "."):
                continue
            step = where / part
            try:
                following: int | None = os.open(part, _STEP_FLAGS, dir_fd=current)
            except (FileNotFoundError, NotADirectoryError):
                following = None  # (under a file: nothing there, nothing can be made)
            except OSError as error:
                if error.errno in NO_DESCRIPTORS:
                    raise  # (the host's shortage, not the step's: `_hold_way`)
                return None, step  # (unsure: as if it were)
            try:
                if part == "..":  # the directory's own parent, whatever its path says
                    if following is None:
                        return None, None  # (a file's parent: the kernel finds nothing)
                    os.close(current)
                    current, following = following, None
                    where = where.parent
                    continue
                info = os.fstat(following) if following is not None else None
                # a missing entry: would a program's, made now, be allowed there
                made = info or os.stat_result((stat.S_IFLNK, 0, 0, 1, uid, uid, 0, 0, 0, 0))
                parent = os.fstat(current)
                if not stat.S_ISDIR(parent.st_mode):
                    return None, None  # a file's "entry": the kernel finds nothing
                if _programs_may_place_in(parent, made, uid, acl_of=current) or any(
                    _inside(step, place) for place in places
                ):
                    return None, step
                if following is None:
                    return None, None
                if stat.S_ISLNK(made.st_mode):
                    hops += 1
                    if hops > MAX_SYMLINK_HOPS:
                        return None, step
                    target = Path(os.readlink("", dir_fd=following))
                    if target.is_absolute():
                        os.close(current)
                        current = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                        where = Path("/")
                    parts = [p for p in target.parts if p != "/"] + parts
                    continue
                os.close(current)
                current, following = following, None
                where = step
            finally:
                if following is not None:
                    os.close(following)
        return (fcntl.fcntl(current, fcntl.F_DUPFD_CLOEXEC, 10), where), None
    finally:
        os.close(current)


def read_only_entry_holding(place: Path) -> Path | None:
    """The first HARNESS_SANDBOX_READ_ONLY entry (resolved) that shows every sandboxed
    program `place` (resolved; a workspace, a server's writable path), or None. What
    programs write there was every other program's to read, and to run: one agent's
    program put a file in its workspace, inside an entry, that another agent's command
    read, its 0600 secrets too (as root, all run as the sandbox user). A place in
    Harness's own state is not shown (covered where it lies in a bind)."""
    if any(_inside(place, hidden) for hidden in hidden_paths()):
        return None
    # (every absolute entry, those read_only_problem refuses too: the place is named
    # whatever else stops the programs)
    entries = getattr(settings, "HARNESS_SANDBOX_READ_ONLY", [])
    resolved = [Path(entry).resolve() for entry in entries if entry.startswith("/")]
    held = next((entry for entry in resolved if _inside(place, entry)), None)
    if held is not None:
        return held
    # An entry on which a directory is bound (mount --bind) shows that directory at
    # another path: the same directory (device and inode) as the place or one above it.
    shown = {i: entry for entry in resolved if (i := _directory_identity(entry)) is not None}
    above = (place, *place.parents)
    return next((shown[i] for d in above if (i := _directory_identity(d)) in shown), None)


def _directory_identity(path: Path) -> tuple[int, int] | None:
    """The device and inode of `path` (followed), or None when it cannot be read."""
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_dev, info.st_ino


def hidden_paths() -> list[Path]:
    """Harness's own state: never visible in the sandbox, wherever it lies."""
    paths = {Path(settings.DATA_DIR), Path(settings.BASE_DIR)}
    paths.add(Path(settings.HARNESS_WORKSPACE_ROOT))
    for database in settings.DATABASES.values():
        if str(database.get("ENGINE", "")).endswith("sqlite3"):
            for name in (database.get("NAME"), (database.get("TEST") or {}).get("NAME")):
                if name and str(name) != ":memory:":
                    paths.add(Path(name).parent)
    redis_url = str(getattr(settings, "REDIS_URL", ""))
    if redis_url.startswith("unix://"):
        paths.add(Path(redis_url.removeprefix("unix://").split("?", 1)[0]).parent)
    return sorted({path.resolve() for path in paths})


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def _limit_command(
    limits: Limits,
    cgroups: Cgroups,
    *,
    report_exit: bool = False,
    exec_report: Path | None = None,
) -> list[str]:
    """The launcher: a shell that joins the cgroups, opens the seccomp filter as
    SECCOMP_FD (and `exec_report`, a StartReport's `exec_path`, as EXEC_FD when given)
    and becomes prlimit (setrlimit for everything the sandbox starts), which becomes
    bwrap. A cgroup that cannot be joined stops it before anything runs (125).
    With `report_exit` the shell stays, waits, and writes EXIT_REPORT with the status to
    stderr (a server's log says why it ended; bwrap dies with it, --die-with-parent), and
    the command's stderr reaches the shell's through a pipe (the program never holds the
    log it goes to).

    Without a pids cgroup, processes are bounded by RLIMIT_NPROC, which counts every
    process and thread of Harness's uid on the host: the limit is what the uid runs now
    plus `limits.processes`. Without a memory cgroup, memory is bounded by RLIMIT_AS, per
    process.
    """
    prlimit = [
        _binary("prlimit") or "prlimit",
        f"--cpu={limits.cpu}:{limits.cpu + 1}",  # SIGXCPU, then SIGKILL a second later
        f"--fsize={limits.file_bytes}",
        # 1, not 0: a core_pattern pipe's helper (apport, systemd-coredump) runs as host
        # root at a crash whatever the limit, unless it is 1 (seccomp.RLIMIT_CORE)
        "--core=1",
        # 0: no POSIX message queue. Their bytes are counted per host uid, which every
        # sandbox shares (the sandbox user, or Harness's own uid), so one program holding
        # 819200 bytes of queues (the default limit) left none to any other; no limit
        # above 0 keeps them apart (the count is shared, the limit only a threshold on it)
        "--msgqueue=0",
    ]
    if cgroups.pids is None:
        prlimit.append(f"--nproc={_tasks_of(os.getuid()) + limits.processes}")
    if cgroups.memory is None:
        prlimit.append(f"--as={limits.memory}")
    prlimit.append("--")
    joins = [str(path / "cgroup.procs") for path in cgroups.paths]
    run = f'"$@" {SECCOMP_FD}<"$filter"'
    if exec_report is not None and not report_exit:
        run += f' {EXEC_FD}>>"$report"'
    if report_exit:
        # The command's stderr is a pipe, copied to the shell's own (the server's log) by
        # `cat`, which runs outside the sandbox under the same file size limit; the shell
        # waits for both (the status comes back through descriptor 5) and reports after
        # the last line copied. The log itself was the server's descriptor 2, so it
        # could truncate it (ftruncate), or take O_APPEND away and write over it: erase
        # what it had written. Descriptor 4 is the shell's stdout meanwhile (the server's).
        # A server is stopped by SIGTERM to the launcher's process group (the MCP SDK's
        # killpg, when it did not exit on its stdin's end): the shells wait on (a trap
        # that does nothing; what they start has SIGTERM's default again), `cat` ignores
        # it and copies to the end (bwrap dies of it, and the sandbox with it): the
        # copier and the shell died with the server, the exit report was never written
        # and what was still in the pipe was lost.
        copy = shlex.join([prlimit[0], f"--fsize={limits.file_bytes}", "--core=0", "--", "cat"])
        run = (
            f"trap : TERM; {{ status=$( trap : TERM; {{ {{ trap : TERM; {run} 4>&- 5>&-; "
            f"echo $? >&5; }} 2>&1 >&4 | {{ trap '' TERM; exec {copy} >&2 4>&- 5>&-; }}; "
            f"}} 5>&1 ); }} 4>&1; "
            f'echo "{EXIT_REPORT} $status" >&2; exit $status'
        )
    else:
        run = f"exec {run}"
    script = (
        f'filter=$0; while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; {run}'
    )
    if exec_report is not None and not report_exit:
        script = f"report=$1; shift; {script}"
        first = [str(seccomp.bpf_file()), str(exec_report)]
    else:
        first = [str(seccomp.bpf_file())]
    return ["/bin/sh", "-c", script, *first, *joins, "--", *prlimit]


def _tasks_of(uid: int) -> int:
    """Processes and threads of `uid` on the host now (what RLIMIT_NPROC counts)."""
    count = 0
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
    return count


@functools.cache
def _binary(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), os.defpath]))


# --- Processes and memory: cgroups ----------------------------------------------------------


@contextlib.contextmanager
def _call_cgroups(limits: Limits) -> Iterator[Cgroups]:
    """The cgroups of one call (see sandbox_cgroups). A pids cgroup is required when
    Harness is root: the kernel does not apply RLIMIT_NPROC to uid 0 (the launcher and
    bwrap run as root), and without a user namespace the program's processes would count
    against the sandbox user shared by every call."""
    _require_pids_cgroup()
    with sandbox_cgroups.for_call(limits.processes, limits.memory) as cgroups:
        yield cgroups


def _require_pids_cgroup() -> None:
    if os.geteuid() == 0 and pids_cgroup_root() is None:
        raise SandboxUnavailable(
            "Harness runs as root and no pids cgroup is writable, so the number of "
            "processes cannot be limited; no program runs. An operator must run Harness "
            "as an unprivileged user, or give it a writable pids cgroup."
        )


def pids_cgroup_root() -> Path | None:
    """A directory where this process may create pids cgroups, or None."""
    return sandbox_cgroups.root_for("pids")


def _oom_killed(path: Path | None) -> bool:
    return sandbox_cgroups.oom_killed(path)


# --- Probe (the start-up check and every run) ----------------------------------------------


def probe() -> str | None:
    """Why the bwrap sandbox cannot run here with every guarantee it gives, or None when
    it can. Cached per process and per setting it depends on; a HARNESS_SANDBOX_READ_ONLY
    entry read_only_problem refuses is judged at each call (a start-up check reports it).
    Harness out of descriptors while it judges them is said as such (OutOfDescriptors)."""
    try:
        return _probe_now()
    except OutOfDescriptors as error:
        return str(error)


def _probe_now() -> str | None:
    """`probe`, raising OutOfDescriptors (`require_sandbox` shows its own message)."""
    with contextlib.ExitStack() as held:
        problem = _judged_read_only_entries(held)[1]
    if problem is not None:
        return problem
    return _probe(
        bool(settings.HARNESS_SANDBOX_NETWORK),
        str(settings.HARNESS_SANDBOX_USER),
        str(settings.HARNESS_SANDBOX_MEMORY),
        os.geteuid(),
    )


# Run by sh inside a real sandbox; prints one line per guarantee that does not hold.
PROBE_SCRIPT = r"""
touch "$0/owner" || echo "the workspace is not writable by the sandboxed program"
[ -w /proc/sys/kernel/core_pattern ] && echo "/proc/sys is writable"
grep -q " /proc/sys proc ro," /proc/self/mounts || echo "/proc/sys is not mounted read-only"
grep -Eq "^Seccomp:[[:space:]]+2" /proc/self/status || echo "no seccomp filter is loaded"
setarch "$(uname -m)" -R true 2>/dev/null && echo "the seccomp filter let personality() through"
for set in CapPrm CapEff CapAmb; do
  grep -Eq "^$set:[[:space:]]+0+$" /proc/self/status || echo "the program holds capabilities ($set)"
done
grep -Eq "^NoNewPrivs:[[:space:]]+1$" /proc/self/status || echo "no_new_privs is not set"
exit 0
"""


@functools.cache
def _probe(network: bool, user: str, memory: str, euid: int) -> str | None:
    """Starts a real sandbox and checks from inside and from the host side: the program
    is not host root (the owner of a file it made), /proc/sys is read-only, the seccomp
    filter is loaded and refuses, and memory is limited (a memory cgroup whose limit
    reads back, or RLIMIT_AS seen from inside)."""
    for name in ("bwrap", "prlimit", *(("setpriv",) if euid == 0 else ())):
        if _binary(name) is None:
            package = "bubblewrap" if name == "bwrap" else "util-linux"
            return f"`{name}` is not installed (Debian package {package})"
    try:
        limits = Limits(timeout=10, output_chars=2000, memory_bytes=memory_limit())
        owner = sandbox_user()
        seccomp.bpf_file()
    except (ValueError, SandboxUnavailable) as error:
        return str(error).split(", so no program runs")[0]
    except OSError as error:
        return f"libseccomp could not build the seccomp filter ({error})"
    if euid == 0 and pids_cgroup_root() is None:
        return "Harness runs as root and no pids cgroup is writable"
    with tempfile.TemporaryDirectory(prefix="harness-sandbox-probe-") as scratch:
        workspace = Path(scratch)
        give_to_sandbox(workspace)
        with sandbox_cgroups.for_call(limits.processes, limits.memory) as cgroups:
            script = PROBE_SCRIPT
            if cgroups.memory is None:
                script += f'grep -Eq "^Max address space +{limits.memory} " /proc/self/limits'
                script += ' || echo "RLIMIT_AS is not set"\n'
            argv = ["sh", "-c", script, str(workspace)]
            # (no HARNESS_SANDBOX_READ_ONLY entry: those are judged at each call)
            command = _limit_command(limits, cgroups) + bwrap_command(
                argv, workspace=workspace, cwd=workspace, limits=limits, network=network, extras=[]
            )
            failure = _run_probe(command)
            failure = failure or _memory_cgroup_problem(cgroups.memory, limits.memory)
        failure = failure or _owner_problem(workspace / "owner", owner)
    return failure


def _run_probe(command: list[str]) -> str | None:
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
            env={"PATH": os.defpath},
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap could not run: {error}"
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).decode(errors="replace").strip()
        return f"bwrap cannot create its namespaces: {reason or f'exit code {done.returncode}'}"
    problems = done.stdout.decode(errors="replace").strip().splitlines()
    return "; ".join(problems) or None


def _memory_cgroup_problem(path: Path | None, memory: int) -> str | None:
    if path is None:
        return None  # RLIMIT_AS, checked from inside
    for name in ("memory.max", "memory.limit_in_bytes"):
        with contextlib.suppress(OSError):
            if int((path / name).read_text()) == memory:
                return None
    return "the memory cgroup's limit did not hold"


def _owner_problem(made: Path, owner: tuple[int, int] | None) -> str | None:
    try:
        uid = made.lstat().st_uid
    except OSError:
        return None  # reported from inside already
    expected = owner[0] if owner is not None else os.geteuid()
    if uid == 0 or uid != expected:
        return f"a sandboxed program's file belongs to host uid {uid}, not {expected}"
    return None


# --- Running and reading ----------------------------------------------------------------------


def _run_process(
    command: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    limits: Limits,
    sandboxed: bool,
    pass_fds: tuple[int, ...] = (),
) -> Completed:
    process = _start(command, cwd, env, pass_fds)
    try:
        head, total, stopped = _collect(process, limits)
    finally:
        _kill_group(process)  # background children must not outlive the call
        assert process.stdout is not None
        process.stdout.close()
    return Completed(
        returncode=process.returncode,
        output=_text(head, total, limits, stopped),
        sandboxed=sandboxed,
        stopped_for_output=stopped,
    )


def _start(
    command: list[str], cwd: Path, env: dict[str, str], pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            pass_fds=pass_fds,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so a timeout kills everything
        )
    except FileNotFoundError as error:
        raise ToolError(
            f"Command '{command[0]}' was not found on PATH. Check the name, or run "
            "['sh', '-c', 'command -v NAME'] to see what is installed."
        ) from error
    except PermissionError as error:
        raise ToolError(f"Command '{command[0]}' is not executable: {error.strerror}.") from error
    except OSError as error:
        raise ToolError(f"Command '{command[0]}' could not be started: {error}.") from error


def _collect(process: subprocess.Popen[bytes], limits: Limits) -> tuple[bytes, int, bool]:
    """Read the output while it is produced: (kept head, total bytes, stopped for output).

    Keeps at most 4 bytes per character of the model's share; stops the program past
    `limits.output_bytes`. Raises TimeoutError at the deadline. Once the program itself
    has exited, whatever it left running is killed and the pipe drained briefly.
    """
    assert process.stdout is not None
    fd = process.stdout.fileno()
    os.set_blocking(fd, False)
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    keep = limits.output_chars * 4 + 4
    ceiling = max(limits.output_bytes, keep)
    head = bytearray()
    total = 0
    deadline = time.monotonic() + limits.timeout
    drain_until: float | None = None
    while True:
        now = time.monotonic()
        if drain_until is None and now >= deadline:
            _kill_group(process)
            raise TimeoutError(f"did not finish within {limits.timeout:g} s")
        if drain_until is not None and now >= drain_until:
            break
        limit = drain_until if drain_until is not None else deadline
        if poller.poll(max(1, min(100, int((limit - now) * 1000)))):
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                chunk = None
            if chunk == b"":  # every writer has closed the pipe
                if drain_until is None and not _exits_by(process, deadline):
                    _kill_group(process)
                    raise TimeoutError(f"did not finish within {limits.timeout:g} s")
                break
            if chunk:
                total += len(chunk)
                head += chunk[: max(0, keep - len(head))]
                if total > ceiling:
                    _kill_group(process)
                    return bytes(head), total, True
        if drain_until is None and process.poll() is not None:
            _kill_group(process)
            drain_until = time.monotonic() + 0.5
    return bytes(head), total, False


def _exits_by(process: subprocess.Popen[bytes], deadline: float) -> bool:
    """Whether the program exits by the deadline. Its output closes before it exits
    (coreutils close stdout in an exit handler): killing the group at once would report
    a program that ended well as killed by SIGKILL."""
    try:
        process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    return True


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _text(head: bytes, total: int, limits: Limits, stopped: bool) -> str:
    """The output as the model reads it: at most `output_chars` characters plus notes."""
    text = head.decode("utf-8", errors="replace")
    shown = text[: limits.output_chars]
    if len(shown) < len(text) or total > len(head):
        hidden = total - len(shown.encode("utf-8", errors="replace"))
        shown += f"\n[truncated: about {hidden} more bytes of output]"
    if stopped:
        shown += (
            f"\n[stopped: the command wrote more than {limits.output_bytes} bytes of output "
            "and was killed; send long output to a file in the workspace and read parts of it]"
        )
    return shown


def describe_exit(returncode: int, *, sandboxed: bool) -> str:
    """An exit status in words; under bwrap a signal death arrives as 128+N."""
    signum = -returncode if returncode < 0 else returncode - 128 if sandboxed else 0
    if returncode < 0 or (sandboxed and 128 < returncode < 128 + 65):
        try:
            name = signal.Signals(signum).name
        except ValueError:
            return str(returncode)
        why = {"SIGXCPU": ": the CPU time limit", "SIGXFSZ": ": the file size limit"}
        prefix = f"128+{signum}: " if returncode > 0 else ""
        return f"{returncode} ({prefix}killed by {name}{why.get(name, '')})"
    return str(returncode)
